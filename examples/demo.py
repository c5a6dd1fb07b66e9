"""What `make demo` runs until `tuner launch` exists: the verifier and the search.

For every built-in program it builds the reference graph and the hand-written fused
structure, instantiates both small, and checks them with the finite-field verifier; it shows
a mutant (wrong for-loop accumulator) being rejected; then the search finds the fused
rmsnorm_matmul kernel on its own.  Prints timings.
"""

from __future__ import annotations

import time

from cluster import LocalExecutor, search_program
from search import (
    BlockGraph,
    KernelGraph,
    builtin_names,
    format_graph,
    from_obj,
    handwritten,
    load_program,
    small_instance,
)
from verifier import build_tables, equivalent


def main() -> None:
    program = load_program("rmsnorm_matmul", {"X": "16x1024", "W": "1024x1024"})
    print("== rmsnorm_matmul: reference graph ==")
    print(format_graph(program.build()))
    print("\n== the fused structure: one kernel, grid over W's columns, loop over k ==")
    print(format_graph(handwritten(program)))

    start = time.perf_counter()
    build_tables()
    print(f"\n(finite-field tables built once per process: "
          f"{(time.perf_counter() - start) * 1e3:.0f} ms)")
    print("\n== every built-in: fused structure vs reference (finite field, 4 tests) ==")
    for name in builtin_names():
        small = small_instance(load_program(name))
        reference, fused = small.build(), handwritten(small)
        config = {s: 2 for s in sorted(fused.symbols())}
        start = time.perf_counter()
        verdict = equivalent(reference, fused, config=config)
        ms = (time.perf_counter() - start) * 1e3
        status = "EQUIVALENT" if verdict else "NOT EQUIVALENT"
        print(f"  {name:<17} {status:<15} {ms:6.2f} ms   config {config}")

    print("\n== a mutant: the rms accumulator replaced by a plain sum ==")
    small = small_instance(load_program("rmsnorm_matmul"))
    g = KernelGraph()
    x_in, w_in = (g.new_input(s, small.dtype, n) for n, s in small.inputs.items())
    bg = BlockGraph(("g0",), "F")
    x = bg.new_input(x_in, imap=(-1,), fmap=1)
    w = bg.new_input(w_in, imap=(1,), fmap=0)
    bg.new_output(bg.div(bg.forloop_accum(bg.matmul(x, w)), bg.forloop_accum(x, "sum")),
                  omap=(1,))
    (out,) = g.graph_kernel(bg)
    g.mark_output(out)
    verdict = equivalent(small.build(), g, config={"g0": 2, "F": 2})
    print(f"  {'EQUIVALENT' if verdict else 'REJECTED'}: {verdict.reason}")

    print("\n== the search rediscovers the fused kernel (in-process, no Ray) ==")
    result = search_program(program, executor=LocalExecutor())
    summary = result.summary()
    print(f"  {summary['states_explored']:,} states, {summary['pruned']:,} pruned, "
          f"{summary['verified']} verified structures in {summary['elapsed_s']:.2f} s; best:")
    print(format_graph(from_obj(result.best["graph"])))


if __name__ == "__main__":
    main()
