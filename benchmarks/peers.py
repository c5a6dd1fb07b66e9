"""Our kernels beside what users already have, on the same inputs, in one run.

    .venv/bin/python benchmarks/peers.py [--device cpu|cuda] [--db URL] [--structures DIR]
        [--sweep FILE] [--only NAME ...] [--rounds 5] [--threads N] [--budget S]
        [--no-compile] [--json]

Rows: the suite's programs at their default (paper) shapes, or ``--only`` names and program
files (``benchmarks/programs/*.yaml``: the blocks searched in pieces).  Columns, each timed by
the one timing loop (``kernels.measure``: host clock on a cpu, CUDA events on a GPU), interleaved
round robin for ``--rounds`` rounds, medians reported:

- ``numpy`` (cpu) / ``cupy`` (cuda): the reference program op by op (one library call per op);
- ``torch``: PyTorch eager, the same ops on torch tensors (``torch.float32`` on a cpu, the
  program's dtype on a GPU);
- ``compile`` / ``compile-max``: ``torch.compile`` of that function (default mode, and
  ``max-autotune-no-cudagraphs``), compiled before timing;
- ``tuner``: our kernel — the best stored in ``--db`` for this device (``tuner.best``; where
  the library path won the launch, what ``tuner.load`` serves: numpy op by op), or the
  fastest checked trial of a ``--sweep`` file (``benchmarks/sweep.py``: structures and configs
  measured on this device), or else the structure of ``--structures`` (search outputs) or
  the hand-written one that the device's roofline estimate ranks first, with the AStitch default config — checked against
  the float reference in the isolated worker first, then called in this process.

Same thread count for all (``--threads``, default every core: OMP/OpenBLAS/MKL variables set
before numpy loads, ``torch.set_num_threads``).  Each column's max |error| against the float64
reference is reported; ratios are peer time / tuner time (> 1: we win).  torch is the bench
extra: ``pip install -e '.[bench]'`` (``torch==2.13.0``, a CPU build on these machines).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ("rmsnorm_matmul", "gated_mlp", "lora", "gqa", "qknorm_gqa", "mha", "mqa", "ntrans")
TORCH_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


def torch_arith(torch):
    """The float interpreter's arithmetic over torch tensors: the reference program, op by op,
    as a PyTorch user would write it (and what torch.compile then fuses)."""
    from verifier import FloatArith

    class TorchArith(FloatArith):
        name = "torch"

        def matmul(self, a, b):
            return torch.matmul(a, b)

        def exp(self, a):
            return torch.exp(a)

        def sqrt(self, a):
            return torch.sqrt(a)

        def sigmoid(self, a):
            return torch.sigmoid(a)

        def gelu(self, a):
            return torch.nn.functional.gelu(a, approximate="tanh")

        def relu(self, a):
            return torch.relu(a)

        def sum_axes(self, a, axes):
            return torch.sum(a, dim=tuple(axes), keepdim=True)

    return TorchArith()


class Side:
    """One column: a callable on its own copies of the inputs, and how to read its output."""

    def __init__(self, name: str, fn, to_host, clock=None) -> None:
        self.name, self.fn, self.to_host, self.clock = name, fn, to_host, clock


def sides(args, program, device, inputs) -> list[Side]:
    """Every column that can run here for ``program`` (absent ones are left out)."""
    import numpy as np

    from verifier import FloatArith, run

    ref = program.build()
    out: list[Side] = []
    gpu = args.device == "cuda"
    if gpu:
        import cupy as cp

        from kernels.devices import EventClock, cupy_arith

        dtype = {"float16": cp.float16, "bfloat16": cp.float32}.get(program.dtype, cp.float32)
        xs = [cp.asarray(x, dtype) for x in inputs]
        arith = cupy_arith(cp)
        out.append(Side("cupy", lambda: run(ref, xs, arith), cp.asnumpy, EventClock(cp)))
    else:
        xs = [np.ascontiguousarray(x, np.float32) for x in inputs]
        arith = FloatArith()
        out.append(Side("numpy", lambda: run(ref, xs, arith), np.asarray))
    try:
        import torch
    except ImportError:
        print("# torch is not installed: pip install -e '.[bench]'", file=sys.stderr)
        torch = None
    if torch is not None:
        dev = "cuda" if gpu else "cpu"
        tdtype = getattr(torch, TORCH_DTYPES[program.dtype]) if gpu else torch.float32
        ts = [torch.as_tensor(np.asarray(x, np.float32), device=dev).to(tdtype) for x in inputs]
        tarith = torch_arith(torch)

        def eager():
            return run(ref, ts, tarith)

        clock = TorchClock(torch) if gpu else None
        host = lambda t: t.float().cpu().numpy()  # noqa: E731
        out.append(Side("torch", eager, host, clock))
        modes = () if args.no_compile else (("compile", "default"),
                                             ("compile-max", "max-autotune-no-cudagraphs"))
        for name, mode in modes:
            t0 = time.perf_counter()
            # every program's eager() is the same code object: without a reset dynamo keeps
            # recompiling it and, past its cache limit, silently runs it eagerly
            torch._dynamo.reset()
            try:
                compiled = torch.compile(eager, mode=mode, dynamic=False)
                compiled()  # compile now, not inside the timing
            except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
                print(f"# {program.name}: torch.compile({mode}) failed: "
                      f"{type(e).__name__}: {str(e).splitlines()[0][:200]}", file=sys.stderr)
                continue
            print(f"# {program.name}: torch.compile({mode}) compiled in "
                  f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
            out.append(Side(name, compiled, host, clock))
    ours = tuner_side(args, program, device, inputs)
    if ours is not None:
        out.append(ours)
    return out


class TorchClock:
    """``kernels.devices.Clock`` over torch CUDA events."""

    def __init__(self, torch) -> None:
        self.torch = torch
        self.begin = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        self.begin.record()

    def stop(self) -> float:
        self.end.record()
        self.end.synchronize()
        return self.begin.elapsed_time(self.end) * 1e-3


def tuner_side(args, program, device, inputs) -> Side | None:
    """Our kernel for ``program`` on ``device``: stored best, else the top-ranked structure."""
    import numpy as np

    from kernels import rank_structures
    from search import handwritten
    from tuner.api import read_structures

    ref = program.build()
    structure, config, source, label = None, None, None, ""
    if args.db:
        import tuner

        record = tuner.best(program, device=device.key, url=args.db)
        if record is not None and record.library and args.device == "cpu":
            # the library path won the launch: what tuner.load serves is numpy op by op
            call = tuner.load(program, device=device.key, url=args.db)
            outs = [np.empty(s, np.float32) for s in (tuple(t.shape) for t in call_outputs(ref))]
            xs = [np.ascontiguousarray(x, np.float32) for x in inputs]
            return Side("tuner (stored library, numpy op by op)",
                        lambda: call(*xs, out=outs), np.asarray)
        if record is not None:
            from search import from_obj

            structure, config = from_obj(record.structure), record.config
            source, label = record.source, f"stored {record.structure_hash[:10]}"
    if structure is None and args.sweep:
        found = swept_best(args.sweep, program.name)
        if found is not None:
            structure, config, label = found
    if structure is None:
        graphs, names = [handwritten(program), ref], ["hand-written", "reference"]
        found = Path(args.structures or "") / f"{program.name}.json"
        if args.structures and found.is_file():
            for entry in read_structures(str(found)):
                graphs.append(entry.graph)
                names.append(f"search {entry.hash[:10]}")
        best = rank_structures(graphs, device.spec)[0]
        structure, label = graphs[best], names[best]
        if args.device == "cuda":  # the dialect whose estimate is faster (untuned default)
            from kernels import estimate

            dialects = [{}, {"triton": 1}]
            times = []
            for knobs in dialects:
                try:
                    times.append(estimate(structure, knobs or None, device.spec).seconds)
                except ValueError:
                    times.append(float("inf"))
            config = dialects[times.index(min(times))] or None
    plan = device.lower(structure, config, program.name)
    source = source or device.render(plan)
    res = device.check(plan, ref, source=source, inputs=inputs)
    if not res.ok:
        print(f"# {program.name}: our kernel failed its check: {res.status}: "
              f"{res.message[:300]}", file=sys.stderr)
        return None
    if args.device == "cuda":
        import cupy as cp

        from kernels.devices import STORAGE, EventClock, build_kernel

        xs = [cp.asarray(x, STORAGE.get(b.dtype, np.float32))
              for x, b in zip(inputs, plan.inputs, strict=True)]
        outs = [cp.empty(b.shape, STORAGE.get(b.dtype, np.float32)) for b in plan.outputs]
        raw = build_kernel(cp, plan, source)  # launched directly: no host copies timed
        return Side(f"tuner ({label}, {plan.config})", lambda: (raw(xs, outs), outs)[1],
                    lambda o: cp.asnumpy(o).astype(np.float32), EventClock(cp))
    from kernels.devices import STORAGE, from_storage, to_storage

    call = device.load(plan, source)  # arrays in the program's storage dtype: no conversions
    xs = [to_storage(x, b.dtype) for x, b in zip(inputs, plan.inputs, strict=True)]
    outs = [np.empty(b.shape, STORAGE.get(b.dtype, np.float32)) for b in plan.outputs]
    dtype = plan.outputs[0].dtype
    return Side(f"tuner ({label}, {plan.config})", lambda: call(*xs, out=outs),
                lambda o: from_storage(o, dtype))


def swept_best(path: str, name: str) -> tuple | None:
    """(structure, config, label) of the fastest checked trial of ``name`` in a
    ``benchmarks/sweep.py`` file (JSON lines, optionally gzipped), or None: also where that
    trial is slower than the fused default the sweep measured first (a sweep stopped before
    it tuned the program: on an H100 mha's only trial was a CUDA-C config at 50 ms)."""
    import gzip

    from search import from_obj

    opener = gzip.open if path.endswith(".gz") else open
    graphs, best, default_s = {}, None, None
    with opener(path, "rt") as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("program") != name:
                continue
            if rec["kind"] == "structure":
                graphs[rec["hash"]] = rec["graph"]
            elif rec["kind"] == "baseline":
                default_s = rec.get("default_s")
            elif rec["kind"] == "trial" and rec["status"] == "ok" and rec.get("median_s") \
                    and (best is None or rec["median_s"] < best["median_s"]):
                best = rec
    if best is None or best["structure"] not in graphs:
        return None
    if default_s and best["median_s"] > default_s:  # a sweep cut short (mha, 2026-11-27)
        print(f"# {name}: the sweep's fastest trial ({best['median_s'] * 1e3:.4f} ms) is slower "
              f"than the default it measured ({default_s * 1e3:.4f} ms): not used",
              file=sys.stderr)
        return None
    return (from_obj(graphs[best["structure"]]), best["config"],
            f"swept {best['structure'][:10]} ({best['median_s'] * 1e3:.4f} ms there)")


def call_outputs(graph) -> list:
    """The output tensors of a program's reference graph, in order."""
    return [graph.tensors[t] for t in graph.output_ids]


def run(args) -> list[dict]:
    import numpy as np

    from kernels import get_device, measure, random_inputs
    from kernels.devices import reference
    from search import load_program

    device = get_device(args.device)
    print(f"# {device.key}; threads {args.threads or os.cpu_count()}; rounds {args.rounds}",
          file=sys.stderr)
    rows = []
    for name in args.only or PROGRAMS:
        program = load_program(name)
        inputs = random_inputs(program.build())
        want = reference(program.build(), inputs)
        cols = sides(args, program, device, inputs)
        times: dict[str, list[float]] = {c.name: [] for c in cols}
        errors: dict[str, float] = {}
        for c in cols:  # one call each for the error (and the first-call costs)
            got = c.fn()
            got = got[0] if isinstance(got, list | tuple) else got
            errors[c.name] = float(np.max(np.abs(c.to_host(got).astype(np.float64) - want[0])))
        for _ in range(args.rounds):
            for c in cols:
                t = measure(c.fn, budget_s=args.budget, clock=c.clock)
                times[c.name].append(t.median_s)
        med = {k: statistics.median(v) for k, v in times.items()}
        ours = next((k for k in med if k.startswith("tuner")), None)
        rows.append({"program": name, "device": device.key, "ms": {k: v * 1e3
                                                                   for k, v in med.items()},
                     "max_error": errors, "tuner": ours,
                     "ratio": {k: med[k] / med[ours] for k in med if ours and k != ours}})
        print(f"# {name}: " + ", ".join(f"{k.split(' (')[0]} {v * 1e3:.4f} ms"
                                        for k, v in med.items()), file=sys.stderr)
    return rows


def table(rows: list[dict]) -> str:
    peers = []
    for r in rows:
        peers += [k for k in r["ms"] if not k.startswith("tuner") and k not in peers]
    head = "| program | tuner ms | " + " | ".join(f"{p} ms" for p in peers) + " | " + \
        " | ".join(f"{p} / tuner" for p in peers) + " | tuner kernel |"
    lines = [head, "|" + "---|" * (3 + 2 * len(peers))]
    for r in rows:
        t = r["tuner"]
        cells = [f"{r['ms'][t]:.4f}" if t else "-"]
        cells += [f"{r['ms'][p]:.4f}" if p in r["ms"] else "-" for p in peers]
        cells += [f"{r['ratio'][p]:.2f}x" if p in r.get("ratio", {}) else "-" for p in peers]
        lines.append(f"| {r['program']} | " + " | ".join(cells) + f" | {t or '-'} |")
    ratios = {p: [r["ratio"][p] for r in rows if p in r.get("ratio", {})] for p in peers}
    lines.append("| geometric mean | | " + " | ".join("" for _ in peers) + " | " + " | ".join(
        f"{math.exp(statistics.fmean(math.log(x) for x in v)):.2f}x" if v else "-"
        for v in ratios.values()) + " | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--db", help="database URL: our column is the stored best kernel")
    parser.add_argument("--structures", metavar="DIR", help="search outputs, <program>.json")
    parser.add_argument("--sweep", metavar="FILE",
                        help="a benchmarks/sweep.py file: our column is its fastest trial")
    parser.add_argument("--only", nargs="*", metavar="PROGRAM",
                        help="suite names or program files (benchmarks/programs/*.yaml); "
                             "default the suite")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=0.3, help="seconds per timing")
    parser.add_argument("--threads", type=int, default=0, help="threads (default all cores)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.sweep and not Path(args.sweep).is_file():
        print(f"peers.py: --sweep {args.sweep}: no such file (a benchmarks/sweep.py output)",
              file=sys.stderr)
        return 2
    if args.threads:
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(args.threads)
    sys.path.insert(0, str(ROOT))
    from search import ProgramError, load_program

    for spec in args.only or ():
        try:
            load_program(spec)
        except ProgramError as err:
            print(f"peers.py: --only {spec}: {err}", file=sys.stderr)
            return 2
    try:
        import torch

        torch.set_num_threads(args.threads or os.cpu_count() or 1)
    except ImportError:
        pass
    from kernels import DeviceUnavailable

    try:
        rows = run(args)
    except DeviceUnavailable as err:
        print(f"peers.py: {err}", file=sys.stderr)
        return 2
    print(json.dumps(rows, indent=2) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
