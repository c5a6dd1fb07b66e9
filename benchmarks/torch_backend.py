"""PyTorch model blocks three ways in one process: eager, Inductor, ``backend="tuner"``.

    .venv/bin/python benchmarks/torch_backend.py [--db URL] [--hidden 1024] [--rows 4]
        [--only NAME ...] [--dtype float32] [--budget S] [--rounds 7] [--calls 50]
        [--no-tune] [--threads N]

The blocks are examples/torch_blocks.py's (Llama RMSNorm and MLP, GPT-2's MLP, causal attention
written out, LayerNorm, residual + RMSNorm) at decode shapes: ``--rows`` rows (tokens) of
``--hidden`` features.  First each block is compiled with ``tune="now"`` into ``--db`` (search
and tuning within ``--budget`` seconds per compile; what the database already holds is not
tuned again; ``--no-tune``: use only what it holds), then the three callables are timed
interleaved round robin, ``--calls`` calls per round, ``--rounds`` rounds; the table gives
each one's median per-call time, the tuner's speedup over Inductor, the share of the block's
ATen ops the tuner ran as kernels, and the geometric mean of the speedups.  Under load (other
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
    from kernels.machine import cpu_model

    blocks = _blocks()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default="sqlite:///./torch_bench.db")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--only", nargs="*", choices=blocks.BLOCKS)
    ap.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    ap.add_argument("--budget", type=float, default=120.0)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--no-tune", action="store_true")
    ap.add_argument("--threads", type=int, default=None)
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
            ours = tuner.compile(model, db=a.db, tune="cached" if a.no_tune else "now",
                                 budget_s=a.budget, trials=8, structures=2)
            want = model(*args)
            for fn in (inductor, ours):  # compile (and tune) before any timing
                got = fn(*args)
                for g, w in zip(got if isinstance(got, tuple) else (got,),
                                want if isinstance(want, tuple) else (want,), strict=True):
                    err = float((g.float() - w.float()).abs().max())
                    if not err <= 5e-2 * max(1.0, float(w.float().abs().max())):
                        print(f"{name}: max |error| {err:.3g} against eager", file=sys.stderr)
                        return 1
            times: dict[str, list[float]] = {"eager": [], "inductor": [], "tuner": []}
            fns = {"eager": model, "inductor": inductor, "tuner": ours}
            for _ in range(a.rounds):
                for key, fn in fns.items():
                    times[key].append(_per_call(fn, args, a.calls))
        med = {k: statistics.median(v) for k, v in times.items()}
        report = ours.report()
        share = f"{len(report.kernels)}/{len(report.regions)} regions"
        rows.append((name, med, report, share))
        print(f"# {name}: {report}", flush=True)
    print(f"\n{'block':18} {'eager us':>10} {'inductor us':>12} {'tuner us':>10} "
          f"{'vs inductor':>12}  captured  kernels")
    ratios = []
    for name, med, report, share in rows:
        ratio = med["inductor"] / med["tuner"]
        ratios.append(ratio)
        print(f"{name:18} {med['eager'] * 1e6:10.1f} {med['inductor'] * 1e6:12.1f} "
              f"{med['tuner'] * 1e6:10.1f} {ratio:11.2f}x  {report.captured:>3}/{report.total:<3}"
              f"  {share}")
    geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    print(f"geomean tuner vs inductor: {geo:.2f}x ({cpu_model()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
