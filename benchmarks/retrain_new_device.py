"""A device the stored model never trained on (the repository's dataset file of one CPU
imported and trained on, launches on another CPU): what the retrain at a launch's end should
give the next launch there.

    .venv/bin/python benchmarks/retrain_new_device.py --db sqlite:///two.db \
        --base-device KEY --device KEY [--launch 8] [--next 60] [--seeds 0 1 2] [--json OUT]

Prepare the database with both CPUs' dataset files (``tuner import dataset
benchmarks/data/dataset_*.jsonl.gz --db ...``).  A base model (the default LightGBM, as
``tuner model train`` fits it) is fitted on every row of ``--base-device``.  Per seed, of the
programs only ``--device`` measured (new to the base), ``--launch`` are a launch's: each of
their structures' rows is split at random into half A (what the launch measured) and half B1
(configs of the same structures the next launch measures); ``--next`` others are B2 (a next
launch of new programs).  Scored on B1 and B2 (Kendall tau, top-1 slowdown, MAPE):

- ``fit on A alone``: a model fitted on the launch's rows with the launch's 30 s budget — what
  the retrain made where no model had trained on the device;
- ``base, untaught``: the other CPU's model as it is;
- ``base taught A``: the other CPU's model taught A as ``costmodel.update`` teaches a device it
  never trained on (``UPDATE_TREES`` trees a booster; the base device's structures replayed
  beside them, ``REPLAY`` times as many rows, at least ``REPLAY_MIN``).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="a database holding both devices' rows")
    parser.add_argument("--base-device", required=True, help="the device the model trains on")
    parser.add_argument("--device", required=True, help="the device it never trained on")
    parser.add_argument("--launch", type=int, default=8, help="programs in the launch")
    parser.add_argument("--next", type=int, default=60, help="new programs in the next one")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args(argv)
    if args.launch < 1 or args.next < 1:
        print("retrain_new_device: --launch and --next must be >= 1", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    import numpy as np

    import db
    from costmodel import evaluate, make_model, samples_from_rows
    from costmodel._update import UPDATE_TREES, _replayed, replay_size
    from kernels.machine import cpu_name
    from tuner.pipeline.run import TRAIN_BUDGET_S

    try:
        database = db.connect(args.db)
        base_rows = db.training_rows(database, args.base_device)
        rows = db.training_rows(database, args.device)
    except Exception as err:  # noqa: BLE001 - a bad URL or database: said, exit 2
        print(f"retrain_new_device: {args.db}: {err}", file=sys.stderr)
        return 2
    new_programs = sorted({r.program for r in rows} - {r.program for r in base_rows})
    for key, got in ((args.base_device, base_rows), (args.device, rows)):
        if not got:
            print(f"retrain_new_device: no ok measurements of {key!r} in {args.db}",
                  file=sys.stderr)
            return 2
    if len(new_programs) < args.launch + args.next:
        print(f"retrain_new_device: {len(new_programs)} programs of {args.device!r} are new to "
              f"the base; --launch + --next asks {args.launch + args.next}", file=sys.stderr)
        return 2
    t = time.perf_counter()
    base_samples = samples_from_rows(base_rows)
    base = make_model("gbdt")
    base.fit(base_samples)
    print(f"base: {len(base_samples)} rows of {args.base_device} featurized and fitted in "
          f"{time.perf_counter() - t:.0f} s (timed on {cpu_name()}); {len(new_programs)} "
          f"programs of {args.device} are new to it", flush=True)
    counts: dict[str, int] = {}
    for s in base_samples:
        counts[s.group] = counts.get(s.group, 0) + 1
    out: dict = {"base_device": args.base_device, "device": args.device,
                 "base_rows": len(base_samples), "timed_on": cpu_name(), "seeds": {}}
    for seed in args.seeds:
        rng = np.random.default_rng(seed)
        order = [new_programs[i] for i in rng.permutation(len(new_programs))]
        launch, following = set(order[:args.launch]), set(order[args.launch:][:args.next])
        launched = samples_from_rows([r for r in rows if r.program in launch])
        b2 = samples_from_rows([r for r in rows if r.program in following])
        groups: dict[str, list[int]] = {}
        for i, s in enumerate(launched):
            groups.setdefault(s.group, []).append(i)
        a, b1 = [], []
        for idx in groups.values():
            idx = list(rng.permutation(idx))
            half = (len(idx) + 1) // 2
            a += [launched[i] for i in idx[:half]]
            b1 += [launched[i] for i in idx[half:]]
        print(f"seed {seed}: A {len(a)} rows of {len(launch)} programs, B1 {len(b1)} (their "
              f"other configs), B2 {len(b2)} ({len(following)} new programs)", flush=True)
        figures: dict[str, dict] = {}

        def score(model, name: str, seconds: float, b1=b1, b2=b2, figures=figures) -> None:
            got = {what: evaluate([s.group for s in ss], [s.seconds for s in ss],
                                  model.predict(ss)) for what, ss in (("B1", b1), ("B2", b2))}
            figures[name] = got | {"seconds": round(seconds, 1)}
            print(f"  {name:16s} B1: tau {got['B1']['kendall_tau']:.3f} top-1 "
                  f"{100 * got['B1']['top1_slowdown']:4.1f}% MAPE {got['B1']['mape']:.3f} | "
                  f"B2: tau {got['B2']['kendall_tau']:.3f} top-1 "
                  f"{100 * got['B2']['top1_slowdown']:4.1f}% MAPE {got['B2']['mape']:.3f} "
                  f"({seconds:.1f} s)", flush=True)

        t = time.perf_counter()
        alone = make_model("gbdt", time_budget_s=TRAIN_BUDGET_S / 2)
        alone.fit(a, seed=seed)
        score(alone, "fit on A alone", time.perf_counter() - t)
        score(base, "base, untaught", 0.0)
        replay = _replayed(counts, set(), replay_size(len(a)), seed=seed)
        taught = copy.deepcopy(base)
        t = time.perf_counter()
        taught.update(a + [s for s in base_samples if s.group in replay], trees=UPDATE_TREES)
        score(taught, "base taught A", time.perf_counter() - t)
        out["seeds"][seed] = figures
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
