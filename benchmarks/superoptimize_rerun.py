"""A Mirage script's ``superoptimize()`` run again on a database that holds its result.

    .venv/bin/python benchmarks/superoptimize_rerun.py [--dir DIR] [--runs 3]

In ``DIR`` (default: a new temporary directory) the script below runs once, searching and
tuning (its time is printed; skipped when ``DIR/tuner.db`` already holds it), then ``--runs``
times more, each in a fresh process, printing per run the seconds ``import tuner`` took,
``superoptimize()`` took (wall and this process's CPU: the target is under a second) and the
whole process's wall and CPU time.  On a loaded machine compare the CPU times.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = """
import time
t0 = time.perf_counter()
import tuner as mi
t1, c1 = time.perf_counter(), time.process_time()
graph = mi.new_kernel_graph()
X = graph.new_input(dims=(16, 64), dtype=mi.float16)
W = graph.new_input(dims=(64, 64), dtype=mi.float16)
graph.mark_output(graph.matmul(graph.rms_norm(X, normalized_shape=(64,)), W))
optimized = graph.superoptimize(verbose=False)
t2, c2 = time.perf_counter(), time.process_time()
print(f"{t1 - t0:.3f} {t2 - t1:.3f} {c2 - c1:.3f}")
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from kernels.machine import cpu_model

    where = args.dir or Path(tempfile.mkdtemp(prefix="rerun-"))
    where.mkdir(parents=True, exist_ok=True)
    (where / "demo.py").write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}; "
          f"in {where}")
    for run in range(args.runs + 1):
        t0, c0 = time.perf_counter(), os.times()
        res = subprocess.run([sys.executable, "demo.py"], cwd=where, env=env,
                             capture_output=True, text=True)
        wall, c1 = time.perf_counter() - t0, os.times()
        if res.returncode != 0:
            print(res.stderr[-2000:], file=sys.stderr)
            return 1
        imp, so, so_cpu = (float(v) for v in res.stdout.split())
        cpu = (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system)
        what = "first run" if run == 0 else f"re-run {run}"
        print(f"{what:10s}: import tuner {imp:6.2f} s, superoptimize() {so:7.2f} s "
              f"({so_cpu:.2f} s CPU); "
              f"process {wall:6.2f} s wall, {cpu:5.2f} s CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
