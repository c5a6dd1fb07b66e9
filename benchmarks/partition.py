"""Programs as big as a captured region (8-12 ops), searched in pieces, against issue 22's
target: a verified structure within 60 s each on 2 cores with the default limits.

    .venv/bin/python benchmarks/partition.py [--programs a,b,...] [--workers N] [--time]
                                             [--trials N] [--whole S] [--json FILE]

Programs: every ``benchmarks/programs/*.yaml`` (a decode attention block, a SwiGLU block with
its norm and residual, a GPT-2 MLP block with its layernorm, a LoRA block), or the files /
built-in names given.  One embedded Ray instance with ``--workers`` CPUs (default 2; 0: in
this process) runs every search with the default limits and no time limit given (so the
default, scaled with the program, is in force).

Per program: compute ops, pieces (ops each), states explored, search time, kernels in the
structure found, whether the joined structure verified against the whole program, and whether
a time limit was hit.  ``--time`` (needs quiet cores) also runs ``tuner launch`` of the
program on this cpu (``--trials`` per structure, a fresh database) and compares its best
kernel with the program run op by op by the library path (numpy), as the launch timed both:
the issue asks for tuned ≤ op by op.  ``--whole S`` also runs each program unpartitioned with a time limit of
S seconds, for contrast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cluster import LocalExecutor, RayExecutor, search_program  # noqa: E402
from kernels.machine import cpu_model  # noqa: E402
from search import Limits, load_program  # noqa: E402

HERE = Path(__file__).resolve().parent
TARGET_S = 60.0


def programs(spec: str | None) -> list[str]:
    if spec:  # a file, a name in benchmarks/programs, or a built-in name
        return [str(HERE / "programs" / f"{s}.yaml")
                if (HERE / "programs" / f"{s}.yaml").exists() else s for s in spec.split(",")]
    return sorted(str(p) for p in (HERE / "programs").glob("*.yaml"))


JOB = """
programs:
  - {entry}
tuning:
  trials_per_structure: {trials}
  structures: 2
  sampler: tpe
  seed: 0
devices: [cpu]
cluster:
  workers: {workers}
database:
  url: sqlite:///{db}
"""


def launched(path: str, trials: int, workers: int) -> dict:
    """What ``tuner launch`` of the program gives a user on this cpu (a fresh database, TPE,
    ``trials`` per structure, the best 2 structures): the best kernel's confirmed time, and
    the program run op by op by the library path (numpy), which the launch times beside it.
    (This benchmark once timed configs spread evenly over the space instead: swiglu_block's
    best of 25 such was 6.8 ms, where a launch tunes it to 2.2 ms.)"""
    import subprocess
    import tempfile

    entry = f"file: {Path(path).resolve()}" if path.endswith(".yaml") else f"name: {path}"
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.yaml"
        job.write_text(JOB.format(entry=entry, trials=trials, workers=max(1, workers),
                                  db=Path(tmp) / "tuner.db"))
        # a process of its own: the launch starts its own Ray, beside this script's executor
        code = ("import json, sys, tuner; r = tuner.launch(sys.argv[1], log=lambda s: None, "
                "train=False).reports[0]; print(json.dumps(r.__dict__, default=str))")
        out = subprocess.run([sys.executable, "-c", code, str(job)], capture_output=True,
                             text=True, cwd=HERE.parent, check=True)
        rep = json.loads(out.stdout.strip().splitlines()[-1])
    return {"tuned_s": rep["tuned_s"] or rep["best_s"], "library_s": rep["baseline_s"],
            "config": rep["best_config"], "trials": rep["trials"], "uncertain": rep["uncertain"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", help="comma-separated names or files")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--time", action="store_true", help="tuner launch each, on this cpu")
    ap.add_argument("--trials", type=int, default=30, help="per structure, with --time")
    ap.add_argument("--whole", type=float, help="also search unpartitioned, this time limit")
    ap.add_argument("--json")
    args = ap.parse_args()
    load = os.getloadavg()
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; load average at start "
          f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}")
    t0 = time.perf_counter()
    executor = RayExecutor(args.workers) if args.workers else LocalExecutor()
    where = f"Ray, {args.workers} workers" if args.workers else "in process"
    print(f"executor: {where} (started in {time.perf_counter() - t0:.1f} s)")
    rows = []
    header = (f"{'program':<18} {'ops':>3} {'pieces':<14} {'states':>9} {'search s':>9} "
              f"{'kernels':>7} {'verified':>8} {'limit hit':>9}")
    print(header)
    try:
        for path in programs(args.programs):
            program = load_program(path)
            res = search_program(program, executor=executor)
            s = res.summary()
            part = s["partition"] or {}
            pieces = part.get("pieces", [])
            row = {"program": program.name, "ops": len(
                [op for op in program.build().ops if op.kind not in ("input", "output")]),
                "pieces": [p["ops"] for p in pieces], "states": s["states_explored"],
                "search_s": round(res.elapsed_s, 2),
                "kernels": s["best"]["num_kernels"] if s["best"] else None,
                "verified": bool(res.verified) and part.get("verified_whole") is not False,
                "time_limit_s": s["time_limit_s"], "time_limit_hit": s["time_limit_hit"],
                "piece_reports": pieces}
            print(f"{row['program']:<18} {row['ops']:>3} "
                  f"{'+'.join(map(str, row['pieces'])) or 'whole':<14} {row['states']:>9,} "
                  f"{row['search_s']:>9.1f} {row['kernels'] or '-':>7} "
                  f"{'yes' if row['verified'] else 'no':>8} "
                  f"{'yes' if row['time_limit_hit'] else 'no':>9}", flush=True)
            if args.time and res.best:
                row.update(launched(path, args.trials, args.workers))
                if row["tuned_s"] and row["library_s"]:
                    print(f"{'':<18} launched: tuned {row['tuned_s'] * 1e3:.3f} ms vs op by op "
                          f"{row['library_s'] * 1e3:.3f} ms "
                          f"({row['library_s'] / row['tuned_s']:.2f}x; {row['trials']} trials, "
                          f"best {row['config']}"
                          f"{'; UNCERTAIN: ' + row['uncertain'] if row['uncertain'] else ''})",
                          flush=True)
                else:
                    print(f"{'':<18} the launch stored no tuned kernel", flush=True)
            if args.whole:
                whole = search_program(program, Limits(partition_above=None),
                                       executor=executor, time_limit_s=args.whole)
                row["whole"] = {"search_s": round(whole.elapsed_s, 1),
                                "states": whole.stats.states, "verified": len(whole.verified),
                                "time_limit_hit": whole.time_limit_hit}
                print(f"{'':<18} unpartitioned: {whole.stats.states:,} states in "
                      f"{whole.elapsed_s:.1f} s, {len(whole.verified)} verified"
                      f"{', time limit hit' if whole.time_limit_hit else ''}", flush=True)
            rows.append(row)
    finally:
        executor.close()
    slowest = max((r["search_s"] for r in rows), default=0.0)
    ok = all(r["verified"] for r in rows) and slowest <= TARGET_S
    load = os.getloadavg()
    print(f"load average at end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}")
    print(f"target: a verified structure within {TARGET_S:.0f} s each: slowest "
          f"{slowest:.1f} s, all verified: {all(r['verified'] for r in rows)} -> "
          f"{'PASS' if ok else 'FAIL'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu_model(), "rows": rows}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
