"""Our cpu kernels on arrays where numpy puts them, against the same arrays 64-byte aligned.

    .venv/bin/python benchmarks/alignment.py [--programs rmsnorm_matmul gated_mlp ...]
        [--rounds 5] [--budget 0.1]

Why: numpy places a large array's data 16 bytes past a page boundary, so every full-width
vector load of a row straddles two cache lines (``kernels/devices/_worker.py``,
``USER_OFFSET``), and users pass numpy arrays.  A kernel as fast there as on aligned arrays
is what they get from ``tuner.load``.  For each program (hand-written structure at its paper
shapes, the cpu default config), the kernel is checked, then timed with the one timing loop
(``kernels.measure``) on inputs 64-byte aligned and on the same values placed as numpy places
them, interleaved for ``--rounds`` rounds; medians and their ratio are printed, with the
device key (the CPU's name).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ("rmsnorm_matmul", "gated_mlp", "lora", "gqa", "qknorm_gqa", "mha", "mqa", "ntrans")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", nargs="+", default=list(PROGRAMS), choices=PROGRAMS)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=0.1, help="seconds per timing")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.budget <= 0:
        print("alignment: --rounds must be >= 1 and --budget > 0", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    import numpy as np

    from kernels import devices as kd
    from kernels import get_device, measure
    from kernels.devices._worker import USER_OFFSET, _aligned_empty
    from search import handwritten, load_program

    cpu = get_device("cpu")
    print(f"# {cpu.key}; inputs 64-byte aligned vs {USER_OFFSET} bytes past (numpy's place)")
    print("| program | dtype | aligned ms | numpy-placed ms | numpy-placed / aligned |")
    print("|---|---|---|---|---|")
    for name in args.programs:
        program = load_program(name)
        ref = program.build()
        plan = cpu.lower(handwritten(program), None, name)
        res = cpu.check(plan, ref)
        if not res.ok:
            print(f"| {name} | failed its check: {res.status}: {res.message} | | | |")
            continue
        kernel = cpu.load(plan, res.source)
        values = kd.as_stored(kd.random_inputs(ref), kd.input_layouts(ref))
        placed = {}
        for offset in (0, USER_OFFSET):
            arrays = []
            for x, b in zip(values, plan.inputs, strict=True):
                stored = kd.to_storage(x, b.dtype)
                a = _aligned_empty(stored.shape, offset=offset, dtype=stored.dtype)
                a[...] = stored
                arrays.append(a)
            placed[offset] = arrays
        outs = [np.asarray(o) for o in kernel(*placed[0])]
        times: dict[int, list[float]] = {0: [], USER_OFFSET: []}
        for _ in range(args.rounds):
            for offset, arrays in placed.items():
                times[offset].append(measure(lambda a=arrays, k=kernel, o=outs: k(*a, out=o),
                                             budget_s=args.budget).median_s)
        aligned, user = (statistics.median(times[o]) for o in (0, USER_OFFSET))
        print(f"| {name} | {program.dtype} | {aligned * 1e3:.3f} | {user * 1e3:.3f} | "
              f"{user / aligned:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
