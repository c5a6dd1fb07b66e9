"""PyTorch model blocks three ways in one process: eager, Inductor, ``backend="tuner"``.

    .venv/bin/python benchmarks/torch_backend.py [--db URL] [--hidden 1024] [--rows 4]
        [--only NAME ...] [--dtype float32] [--budget S] [--rounds 7] [--calls 50]
        [--no-tune] [--threads N]

The blocks are examples/torch_blocks.py's (Llama RMSNorm, MLP and MLP layer (norm, MLP,
residual), GPT-2's MLP, causal attention written out, LayerNorm, residual + RMSNorm; with
``--only hf_llama_layer``, transformers' own LlamaDecoderLayer) at decode shapes: ``--rows`` rows (tokens) of
``--hidden`` features.  First each block is compiled with ``tune="now"`` into ``--db`` (search
and tuning within ``--budget`` seconds per compile; what the database already holds is not
tuned again; ``--no-tune``: use only what it holds), then the three callables are timed
interleaved round robin, ``--calls`` calls per round, ``--rounds`` rounds; the table gives
each one's median per-call time, the tuner's speedup over Inductor, the share of the block's
ATen ops the tuner ran as kernels, and the geometric mean of the speedups.  The tuner is timed
two ways: ``tuner.compile(model)`` (which compiles the module's bound ``forward``, skipping
``nn.Module.__call__``'s machinery under Dynamo) and ``torch.compile(model, backend="tuner")``
(the registered backend, compiled and called exactly as Inductor is, one shape): the second
column shows what the kernels and the call path win on their own.  Under load (other
processes on the cores) the ratios of interleaved runs are what to read, not the times.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _blocks():
    spec = importlib.util.spec_from_file_location("torch_blocks", ROOT / "examples/torch_blocks.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _per_call(fn, args, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - t0) / calls


def main(argv: list[str] | None = None) -> int:
    import torch

    import tuner
    import tuner.pytorch
    from kernels.machine import cpu_model

    blocks = _blocks()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default="sqlite:///./torch_bench.db")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--only", nargs="*", choices=blocks.BLOCKS + blocks.OPTIONAL,
                    help="blocks to run (default: all but the optional "
                    f"{', '.join(blocks.OPTIONAL)}, which needs transformers)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    ap.add_argument("--budget", type=float, default=120.0)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--structures", type=int, default=2,
                    help="structures tuned per program (tune='now')")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--no-tune", action="store_true")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--max-ops", type=int, default=None,
                    help="the largest region handed to the search (default: the backend's)")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype)
    print(f"# {cpu_model()}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"{a.rows} rows, hidden {a.hidden}, {a.dtype}; database {a.db}", flush=True)
    rows = []
    for name in a.only or blocks.BLOCKS:
        model, args = blocks.block(name, a.hidden, a.rows, dtype)
        with torch.no_grad():
            inductor = torch.compile(model)
            extra = {"max_ops": a.max_ops} if a.max_ops else {}
            ours = tuner.compile(model, db=a.db, tune="cached" if a.no_tune else "now",
                                 budget_s=a.budget, trials=8, structures=a.structures, **extra)
            want = model(*args)
            tuner.pytorch.register()
            backend = torch.compile(model, backend="tuner", options={"db": a.db, **extra})
            for fn in (inductor, ours, backend):  # compile (and tune) before any timing
                got = fn(*args)
                for g, w in zip(got if isinstance(got, tuple) else (got,),
                                want if isinstance(want, tuple) else (want,), strict=True):
                    err = float((g.float() - w.float()).abs().max())
                    if not err <= 5e-2 * max(1.0, float(w.float().abs().max())):
                        print(f"{name}: max |error| {err:.3g} against eager", file=sys.stderr)
                        return 1
            times: dict[str, list[float]] = {"eager": [], "inductor": [], "tuner": [],
                                             "backend": []}
            fns = {"eager": model, "inductor": inductor, "tuner": ours, "backend": backend}
            for _ in range(a.rounds):
                for key, fn in fns.items():
                    times[key].append(_per_call(fn, args, a.calls))
        med = {k: statistics.median(v) for k, v in times.items()}
        report = ours.report()
        print(f"# {name}, backend=\"tuner\": {tuner.pytorch.last_report()}", flush=True)
        share = f"{len(report.kernels)}/{len(report.regions)} regions"
        rows.append((name, med, report, share))
        print(f"# {name}: {report}", flush=True)
    print(f"\n{'block':18} {'eager us':>10} {'inductor us':>12} {'tuner us':>10} "
          f"{'vs inductor':>12} {'backend us':>11} {'vs inductor':>12}  captured  kernels")
    ratios: list[float] = []
    backend_ratios: list[float] = []
    for name, med, report, share in rows:
        ratio = med["inductor"] / med["tuner"]
        ratios.append(ratio)
        backend_ratios.append(med["inductor"] / med["backend"])
        print(f"{name:18} {med['eager'] * 1e6:10.1f} {med['inductor'] * 1e6:12.1f} "
              f"{med['tuner'] * 1e6:10.1f} {ratio:11.2f}x {med['backend'] * 1e6:11.1f} "
              f"{backend_ratios[-1]:11.2f}x  {report.captured:>3}/{report.total:<3}  {share}")

    def geo(xs: list[float]) -> float:
        return math.exp(sum(math.log(r) for r in xs) / len(xs))

    print(f"geomean vs inductor: tuner.compile {geo(ratios):.2f}x, backend=\"tuner\" "
          f"{geo(backend_ratios):.2f}x ({cpu_model()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
