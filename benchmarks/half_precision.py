"""Half-precision programs on the cpu: per-call time with arrays of the program's dtype.

    .venv/bin/python benchmarks/half_precision.py [--program gated_mlp ...] [--rounds 15]
    TUNER_CPU_MARCH=x86-64-v3 .venv/bin/python benchmarks/half_precision.py   # the AVX2 path

Each suite program (its hand-written kernel, at small decode shapes) is built three times, as
a float32, a float16 and a bfloat16 program, and each kernel is called through
``CpuKernel`` (what ``tuner.load`` returns) with arrays of its own dtype: numpy float32,
numpy float16, torch.bfloat16 (numpy uint16 bits without torch).  A fourth column calls the
float16 kernel with float32 arrays, which it converts on every call (what every call paid
before kernels read half precision).  The columns are timed in interleaved rounds; each
figure is the median per-call time over the rounds.  The target: float16 and bfloat16 at
least as fast as float32, with AVX-512 and with AVX2 (``TUNER_CPU_MARCH=x86-64-v3``).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# small decode shapes: one token's worth of rows where the program has a batch
SHAPES = {"rmsnorm_residual": {"tokens": 16}, "softmax_rows": {"rows": 64}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--program", action="append", default=[])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--budget", type=float, default=0.02, help="seconds per column a round")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from kernels import get_device, random_inputs
    from kernels.machine import cpu_info, cpu_march, cpu_vector_isa
    from search import handwritten, load_program
    from search.ir.handwritten import HANDWRITTEN

    cpu = get_device("cpu")
    print(f"CPU: {cpu_info().get('model name', '?')}; kernels built for -march={cpu_march()} "
          f"({cpu_vector_isa()[1]} code path)")
    print(f"{'program':18s} {'float32':>10s} {'float16':>10s} {'bfloat16':>10s} "
          f"{'f16 <- f32':>11s}   (median ms per call)")
    for name in args.program or list(HANDWRITTEN):
        base = load_program(name, SHAPES.get(name, {}))
        xs = random_inputs(base.build())
        kernels = {}
        for dtype in ("float32", "float16", "bfloat16"):
            program = dataclasses.replace(base, dtype=dtype)
            plan = cpu.lower(handwritten(program), None, program.name)
            res = cpu.check(plan, program.build())
            if not res.ok:
                print(f"{name}: the {dtype} kernel failed its check: {res.message}")
                return 1
            kernels[dtype] = cpu.load(plan, res.source)
        columns = {d: _caller(kernels[d], _arrays(xs, d)) for d in kernels}
        columns["f16 <- f32"] = _caller(kernels["float16"], xs)
        times = _interleaved(columns, args.rounds, args.budget)
        print(f"{name:18s} " + " ".join(f"{times[c] * 1e3:10.4f}" for c in
                                        ("float32", "float16", "bfloat16")) +
              f" {times['f16 <- f32'] * 1e3:11.4f}", flush=True)
    return 0


def _arrays(xs: list, dtype: str) -> list:
    import numpy as np

    if dtype == "float16":
        return [x.astype(np.float16) for x in xs]
    if dtype == "bfloat16":
        try:
            import torch
        except ImportError:
            from kernels.devices import to_storage

            return [to_storage(x, "bfloat16") for x in xs]
        return [torch.from_numpy(x).to(torch.bfloat16) for x in xs]
    return xs


def _caller(kernel: Callable, arrays: list) -> Callable[[], object]:
    out = kernel(*arrays)  # the outputs, of the kernel's dtype, reused by every call
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the float32-into-float16 column converts on purpose
        kernel(*arrays, out=out)
    return lambda: kernel(*arrays, out=out)


def _interleaved(columns: dict[str, Callable[[], object]], rounds: int,
                 budget: float) -> dict[str, float]:
    """Median per-call seconds of each column, the columns taking turns round by round."""
    warnings.simplefilter("ignore")
    reps = {}
    for c, f in columns.items():  # calls per round: about ``budget`` seconds each
        t0 = time.perf_counter()
        f()
        reps[c] = max(1, min(1000, int(budget / max(time.perf_counter() - t0, 1e-7))))
    samples: dict[str, list[float]] = {c: [] for c in columns}
    for _ in range(rounds):
        for c, f in columns.items():
            t0 = time.perf_counter()
            for _ in range(reps[c]):
                f()
            samples[c].append((time.perf_counter() - t0) / reps[c])
    return {c: statistics.median(s) for c, s in samples.items()}


if __name__ == "__main__":
    raise SystemExit(main())
