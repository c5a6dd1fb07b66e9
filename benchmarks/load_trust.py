"""Trust under load: the stored bests of several databases timed through ``tuner.load`` beside
torch eager and ``torch.compile`` (Inductor), interleaved, in one process.

    .venv/bin/python benchmarks/load_trust.py --db loaded=sqlite:///loaded.db \\
        --db quiet=sqlite:///quiet.db [--program examples/programs/gpt2_mlp_small.yaml] \\
        [--rounds 9] [--calls 20] [--threads N] [--json FILE]

The program is issue 20's GPT-2-style MLP, O = gelu(X·W1)·W2 (tanh GELU), X 16x768,
W1 768x3072, W2 3072x768, float32, on the cpu.  For each database: the stored best (time,
config, whether it is marked uncertain and why), then every callable (each database's best
through ``tuner.load``, torch eager, torch.compile) is timed round robin, ``--calls`` calls a
round, ``--rounds`` rounds, the order rotated each round so no callable always follows the
same one; the table gives each one's median per-call time and its speedup over Inductor.  Run
it on a quiet machine: the point is what each stored best is worth, not how it was measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _per_call(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def main(argv: list[str] | None = None) -> int:
    import numpy as np
    import torch

    import tuner
    from kernels.machine import cpu_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", action="append", required=True, metavar="NAME=URL")
    ap.add_argument("--program", default=str(ROOT / "examples/programs/gpt2_mlp_small.yaml"))
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: its own)")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 768), dtype=np.float32)
    w1 = (rng.standard_normal((768, 3072), dtype=np.float32) / np.sqrt(768)).astype(np.float32)
    w2 = (rng.standard_normal((3072, 768), dtype=np.float32) / np.sqrt(3072)).astype(np.float32)
    tx, tw1, tw2 = (torch.from_numpy(a) for a in (x, w1, w2))

    def mlp(a, b, c):
        return torch.nn.functional.gelu(a @ b, approximate="tanh") @ c

    compiled = torch.compile(mlp)
    with torch.no_grad():
        expected = mlp(tx, tw1, tw2).numpy()
        compiled(tx, tw1, tw2)  # compile now, not in the first round

    callables: dict[str, object] = {}
    stored: dict[str, dict] = {}
    for spec in args.db:
        name, _, url = spec.partition("=")
        record = tuner.best(args.program, device="cpu", url=url)
        if record is None:
            print(f"{name}: nothing stored in {url}", file=sys.stderr)
            return 1
        kernel = tuner.load(args.program, device="cpu", url=url)
        out = [np.empty_like(expected)]
        kernel(x, w1, w2, out=out)
        err = float(np.max(np.abs(out[0] - expected)))
        stored[name] = {"url": url, "time_s": record.time_s, "uncertain": record.uncertain,
                        "config": record.config, "structure": record.structure_hash[:12],
                        "library": bool(record.library), "max_error": err}
        callables[f"{name} best"] = (lambda k=kernel, o=out: k(x, w1, w2, out=o))
    with torch.no_grad():
        callables["torch eager"] = lambda: mlp(tx, tw1, tw2)
        callables["torch.compile"] = lambda: compiled(tx, tw1, tw2)

        for fn in callables.values():  # warm every callable once
            _per_call(fn, 3)
        times: dict[str, list[float]] = {k: [] for k in callables}
        names = list(callables)
        for r in range(args.rounds):
            for k in names[r % len(names):] + names[:r % len(names)]:
                times[k].append(_per_call(callables[k], args.calls))

    med = {k: statistics.median(v) for k, v in times.items()}
    inductor = med["torch.compile"]
    print(f"CPU: {cpu_model()}; torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"{args.rounds} rounds x {args.calls} calls, interleaved")
    for name, s in stored.items():
        mark = f"UNCERTAIN ({s['uncertain']})" if s["uncertain"] else "not marked uncertain"
        print(f"{name}: stored best {s['time_s'] * 1e3:.3f} ms, {mark}; structure "
              f"{s['structure']}{' (library)' if s['library'] else ''}, config {s['config']}; "
              f"max |error| {s['max_error']:.1e}")
    print(f"{'callable':<16} {'median ms':>10} {'min ms':>8} {'max ms':>8} {'vs compile':>10}")
    for k in names:
        print(f"{k:<16} {med[k] * 1e3:>10.3f} {min(times[k]) * 1e3:>8.3f} "
              f"{max(times[k]) * 1e3:>8.3f} {inductor / med[k]:>9.2f}x")
    bests = [k for k in names if k.endswith(" best")]
    for i, a in enumerate(bests):
        for b in bests[i + 1:]:
            print(f"{a} / {b}: {med[a] / med[b]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"cpu": cpu_model(), "torch": torch.__version__, "rounds": args.rounds,
             "calls": args.calls, "stored": stored, "times_s": times, "median_s": med},
            indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
