"""What a loaded cpu kernel costs per call from Python, over the kernel itself.

    .venv/bin/python benchmarks/call_overhead.py [--program ntrans] [--set NAME=VALUE ...]

Compiles one program's hand-written kernel (default: ntrans at its paper shapes, 8x4096, a
kernel of a few tens of microseconds) and times, with the one timing loop:

- ``ctypes``: the library's entry point called directly with pointer arrays built beforehand
  (the kernel plus the bare ctypes call: the floor);
- ``numpy, out=``: ``CpuKernel(*arrays, out=outs)`` on the same numpy arrays every call;
- ``numpy``: the same without ``out`` (an output array allocated per call);
- ``numpy, new arrays``: fresh input arrays every call (no identity fast path);
- ``torch, out=``: torch CPU tensors in and out (if torch is installed).

The overhead of a column is its median minus the ``ctypes`` one; the target is at most 5 µs.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--program", default="ntrans")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--budget", type=float, default=1.0)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import numpy as np

    from kernels import get_device, measure, random_inputs
    from search import handwritten, load_program

    program = load_program(args.program, dict(s.split("=", 1) for s in args.set))
    cpu = get_device("cpu")
    plan = cpu.lower(handwritten(program), None, program.name)
    res = cpu.check(plan, program.build())
    if not res.ok:
        print(f"the kernel failed its check: {res.status}: {res.message}", file=sys.stderr)
        return 1
    kernel = cpu.load(plan, res.source)
    xs = random_inputs(program.build())
    outs = [np.empty(b.shape, np.float32) for b in plan.outputs]

    fptr = ctypes.POINTER(ctypes.c_float)
    raw = ctypes.CDLL(str(kernel.library)).kernel
    raw.argtypes = [ctypes.POINTER(fptr), ctypes.POINTER(fptr)]
    ins = (fptr * len(xs))(*[x.ctypes.data_as(fptr) for x in xs])
    ous = (fptr * len(outs))(*[o.ctypes.data_as(fptr) for o in outs])
    fresh = [[x.copy() for x in xs] for _ in range(64)]
    turn = iter(range(1 << 62))

    columns = {
        "ctypes": lambda: raw(ins, ous),
        "numpy, out=": lambda: kernel(*xs, out=outs),
        "numpy": lambda: kernel(*xs),
        "numpy, new arrays": lambda: kernel(*fresh[next(turn) % 64], out=outs),
    }
    try:
        import torch

        ts = [torch.from_numpy(x) for x in xs]
        touts = [torch.from_numpy(o) for o in outs]
        columns["torch, out="] = lambda: kernel(*ts, out=touts)
    except ImportError:
        pass
    times = {name: measure(fn, budget_s=args.budget).median_s for name, fn in columns.items()}
    floor = times["ctypes"]
    print(f"# {cpu.key}; {program.name} {', '.join(f'{n} {s}' for n, s in program.inputs.items())}")
    print("| call | median µs | overhead µs |\n|---|---|---|")
    for name, t in times.items():
        print(f"| {name} | {t * 1e6:.2f} | {(t - floor) * 1e6:+.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
