"""What launches stored, side by side: the best kernels of several databases timed through
``tuner.load``, interleaved, in one process.

    .venv/bin/python benchmarks/launch_ab.py --db new=sqlite:///new.db --db old=sqlite:///old.db \\
        [--db ...] [--programs rmsnorm_matmul lora ...] [--rounds 5] [--budget 0.3] [--json F]

Why: a change to the tuner (a sampler, the warm start, the confirmation) is judged by what a
user gets from it, the stored best served by ``tuner.load``, not by the time the launch
recorded, which its own noise chose.  Run the same job file once per arm (each with a
database and a ``TUNER_CACHE_DIR`` of its own), then this.  Names sharing a suffix after
``_`` (``new_s0``, ``old_s0``) are paired by it: the ratios are taken per program and pair,
so repeated seeds count apart.  Inputs are random numpy arrays of the program's dtype (no
conversion in the call), the same for every database; each kernel is timed by the one timing
loop (``kernels.measure``), one timing per database per round, the order rotated each round;
medians per program and database, the ratio of each to the first ``--db``, how many it wins
and the geometric mean.  Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", action="append", required=True, metavar="NAME=URL")
    ap.add_argument("--programs", nargs="+", default=["rmsnorm_matmul", "lora", "gqa", "mha"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--budget", type=float, default=0.3, help="seconds per timing")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args(argv)
    dbs = [spec.partition("=")[::2] for spec in args.db]
    if len(dbs) < 2 or any(not name or not url for name, url in dbs) or args.rounds < 1:
        print("launch_ab: give two or more --db NAME=URL and --rounds >= 1", file=sys.stderr)
        return 2

    import numpy as np

    import db
    import tuner
    from kernels import devices as kd
    from kernels import measure
    from kernels.machine import cpu_model
    from search import load_program

    medians: dict[str, dict[str, float]] = {}
    configs: dict[str, dict[str, dict]] = {}
    print(f"# CPU: {cpu_model()}; {args.rounds} interleaved rounds, {args.budget} s a timing")
    for program_name in args.programs:
        program = load_program(program_name)
        ref = program.build()
        values = kd.as_stored(kd.random_inputs(ref), kd.input_layouts(ref))
        arrays = [np.ascontiguousarray(kd.to_storage(v, program.dtype)) for v in values]
        kernels = {}
        for name, url in dbs:
            try:
                record = tuner.best(program, url=url)
            except db.SchemaError as err:  # no database there: said in one line
                print(f"launch_ab: {name}: {err}", file=sys.stderr)
                return 2
            if record is None:
                print(f"launch_ab: {name} stored no best of {program_name} ({url})",
                      file=sys.stderr)
                return 1
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # an UNCERTAIN best is served all the same
                kernels[name] = tuner.load(program, url=url)
            configs.setdefault(program_name, {})[name] = {
                "config": record.config, "stored_s": record.time_s,
                "uncertain": bool(record.uncertain)}
        times: dict[str, list[float]] = {name: [] for name, _ in dbs}
        names = list(times)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                fn = kernels[name]
                times[name].append(measure(lambda f=fn, a=arrays: f(*a), budget_s=args.budget
                                           ).median_s)
        medians[program_name] = {n: statistics.median(t) for n, t in times.items()}
        for name in names:
            c = configs[program_name][name]
            print(f"{program_name:16s} {name:12s} {medians[program_name][name] * 1e3:9.3f} ms"
                  f"  (stored {c['stored_s'] * 1e3:.3f} ms{', UNCERTAIN' if c['uncertain'] else ''})"
                  f"  {c['config']}")
    print(_ratios(medians, [n for n, _ in dbs]))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"cpu": cpu_model(), "rounds": args.rounds, "budget_s": args.budget,
             "median_s": medians, "stored": configs}, indent=1, default=str) + "\n")
    return 0


def _ratios(medians: dict[str, dict[str, float]], names: list[str]) -> str:
    """Per arm (the part of a name before ``_``) against the first: wins and geometric
    mean over programs and pairs (the part after ``_``)."""
    arm = {n: n.split("_", 1)[0] for n in names}
    pair = {n: n.split("_", 1)[1] if "_" in n else "" for n in names}
    base = arm[names[0]]
    lines = []
    for other in dict.fromkeys(arm[n] for n in names if arm[n] != base):
        ratios = [medians[p][a] / medians[p][b] for p in medians for a in names for b in names
                  if arm[a] == other and arm[b] == base and pair[a] == pair[b]]
        if not ratios:
            continue
        gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
        lines.append(f"{other} / {base}: faster on {sum(r < 1 for r in ratios)} of "
                     f"{len(ratios)}, geometric mean {gm:.3f} (min {min(ratios):.3f}, "
                     f"max {max(ratios):.3f})")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
