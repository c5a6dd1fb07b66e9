"""Where should a timing count as noisy?  The noise signals of ``kernels.devices._noise`` on
real timings of this cpu, quiet and with busy-looping processes beside them.

    .venv/bin/python benchmarks/noise_calibration.py [--repeats 3] [--json FILE]

Five suite programs' hand-written kernels at their default shapes and configs are each timed
``--repeats`` times, as a trial times them (``kernels.devices`` CPU build, the launch's
timing settings), under four conditions in turn: quiet, one busy process, two busy processes
(as many as this VM has cores), quiet again.  Per timing: the samples' spread (IQR over
median), the timing thread's CPU share, the median.  The summary gives, for each candidate
``SPREAD_LIMIT``, the share of quiet timings it calls noisy (false alarms: every launch then
reports its best uncertain) and the share of loaded ones it catches with the CPU-share rule
beside it, of all and of those whose median is more than 20% off the kernel's quiet median
(the timings that could mislead a ranking).  Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROGRAMS = ("rmsnorm_matmul", "gated_mlp", "lora", "mqa", "ntrans")
CONDITIONS = (("quiet", 0), ("one busy process", 1), ("two busy processes", 2),
              ("quiet again", 0))
LIMITS = (0.10, 0.15, 0.20, 0.25, 0.30)
HARMFUL = 0.20  # a median this far from the kernel's quiet median could mislead a ranking


def main(argv: list[str] | None = None) -> int:
    from kernels import default_config, get_device, get_spec
    from kernels.devices._noise import CPU_SHARE_MIN
    from kernels.machine import cpu_model
    from kernels.speedup import DEFAULT_TIMING
    from search import handwritten, load_program

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    cpu, spec = get_device("cpu"), get_spec("cpu")
    print(f"CPU: {cpu_model()}; timing {DEFAULT_TIMING}")
    kernels = [(n, g, default_config(g, spec)) for n in PROGRAMS
               for g in [handwritten(load_program(n))]]
    rows = []
    for label, busy in CONDITIONS:
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(busy)]
        time.sleep(1.0)
        try:
            for name, graph, config in kernels:
                for _ in range(args.repeats):
                    tm = cpu.build(graph, config, timing=dict(DEFAULT_TIMING)).timing
                    q = statistics.quantiles(tm["samples_s"], n=4)
                    rows.append({"condition": label, "busy": busy, "program": name,
                                 "spread": (q[2] - q[0]) / tm["median_s"],
                                 "cpu_share": tm["cpu_share"], "median_s": tm["median_s"]})
                    r = rows[-1]
                    print(f"{label:<19} {name:<15} spread {r['spread']:6.1%}  cpu share "
                          f"{r['cpu_share']:4.0%}  median {r['median_s'] * 1e3:8.3f} ms",
                          flush=True)
        finally:
            for h in hogs:
                h.kill()
    quiet_median = {n: statistics.median(r["median_s"] for r in rows
                                         if r["program"] == n and not r["busy"])
                    for n in PROGRAMS}
    quiet = [r for r in rows if not r["busy"]]
    loaded = [r for r in rows if r["busy"]]
    harmful = [r for r in loaded
               if abs(r["median_s"] / quiet_median[r["program"]] - 1) > HARMFUL]
    print(f"\n{len(quiet)} quiet timings, {len(loaded)} loaded ({len(harmful)} of them more "
          f"than {HARMFUL:.0%} off the kernel's quiet median); CPU-share rule < "
          f"{CPU_SHARE_MIN:.0%} beside each spread limit")
    print(f"{'spread limit':>12} {'quiet called noisy':>19} {'loaded caught':>14} "
          f"{'misleading caught':>18}")
    for limit in LIMITS:
        def noisy(r: dict, limit: float = limit) -> bool:
            return r["spread"] > limit or r["cpu_share"] < CPU_SHARE_MIN
        print(f"{limit:>12.0%} {sum(map(noisy, quiet)) / len(quiet):>19.0%} "
              f"{sum(map(noisy, loaded)) / len(loaded):>14.0%} "
              f"{sum(map(noisy, harmful)) / max(1, len(harmful)):>18.0%}")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu_model(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
