"""What a launch's retrain gives the next launch: the model taught the launch's rows
(``costmodel.update``'s rule) against the model before and a refit, on a database's rows.

    .venv/bin/python benchmarks/retrain.py --db sqlite:///ds.db --device KEY
        [--programs 150] [--seeds 0 1] [--full] [--json OUT]

Prepare the database with the CPU dataset file (``tuner import dataset
benchmarks/data/dataset_<cpu>.jsonl.gz --db ...``).  Per seed, ``--programs`` programs are
drawn as the "user's": each of their structures' rows is split at random into half A (what a
launch measured) and half B (what the next launch measures: configs of the same structures
the model never saw); of the other programs' rows 5% are held out (H: configs of structures
the model trained on).  A base model (the default LightGBM) is fitted on the rest, then:

- ``update``: the base taught A as ``costmodel.update`` teaches a launch's rows
  (``UPDATE_TREES`` trees a booster; old structures drawn whole beside them, ``REPLAY`` times
  as many rows, at least ``REPLAY_MIN``);
- ``update, no replay``: A alone;
- ``budgeted refit``: a model fitted on the base rows and A with the launch's 30 s budget
  (what a launch's retrain did before ``update``: 15 s of boosting per model);
- ``full refit`` (``--full``): the default model on the base rows and A, as ``tuner model
  train`` fits it (minutes).

Kendall tau, top-1 slowdown and MAPE on B and H are printed per seed, with the seconds each
took (featurizing excluded: the rows are featurized once, first).
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
    parser.add_argument("--db", required=True, help="a database holding the device's rows")
    parser.add_argument("--device", required=True, help="the device key whose rows to use")
    parser.add_argument("--programs", type=int, default=150)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--full", action="store_true", help="also the full refit (minutes)")
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import numpy as np

    import db
    from costmodel import evaluate, make_model, samples_from_rows
    from costmodel._update import UPDATE_TREES, _replayed, replay_size
    from kernels.machine import cpu_name
    from tuner.pipeline.run import TRAIN_BUDGET_S

    try:
        database = db.connect(args.db)
        rows = db.training_rows(database, args.device)
    except Exception as err:  # noqa: BLE001 - a bad URL or database: said, exit 2
        print(f"retrain: {args.db}: {err}", file=sys.stderr)
        return 2
    if not rows:
        print(f"retrain: no ok measurements of {args.device!r} in {args.db}", file=sys.stderr)
        return 2
    t = time.perf_counter()
    samples = samples_from_rows(rows)
    print(f"{len(samples)} rows of {args.device} featurized in {time.perf_counter() - t:.0f} s "
          f"(timed on {cpu_name()})", flush=True)
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault(s.group, []).append(i)
    out: dict = {"device": args.device, "rows": len(samples), "timed_on": cpu_name(),
                 "seeds": {}}

    def pick(ix):
        return [samples[i] for i in ix]

    for seed in args.seeds:
        rng = np.random.default_rng(seed)
        programs = sorted({s.program for s in samples})
        users = set(rng.choice(programs, min(args.programs, len(programs) - 1), replace=False))
        a, b, h, base_rows = [], [], [], []
        for idx in groups.values():
            if samples[idx[0]].program in users:
                idx = list(rng.permutation(idx))
                a += idx[:len(idx) // 2]
                b += idx[len(idx) // 2:]
            else:
                for i in idx:
                    (h if rng.random() < 0.05 else base_rows).append(i)
        print(f"seed {seed}: base {len(base_rows)} rows; A {len(a)}, B {len(b)} rows of "
              f"{len(users)} programs; H {len(h)}", flush=True)
        figures: dict[str, dict] = {}
        held = {"B": pick(b), "H": pick(h)}

        def score(model, name: str, seconds: float, held=held, figures=figures) -> None:
            got = {what: evaluate([s.group for s in ss], [s.seconds for s in ss],
                                  model.predict(ss)) for what, ss in held.items()}
            figures[name] = got | {"seconds": round(seconds, 1)}
            print(f"  {name:26s} B: tau {got['B']['kendall_tau']:.3f} top-1 "
                  f"{100 * got['B']['top1_slowdown']:4.1f}% MAPE {got['B']['mape']:.3f} | H: "
                  f"tau {got['H']['kendall_tau']:.3f} top-1 {100 * got['H']['top1_slowdown']:4.1f}%"
                  f" MAPE {got['H']['mape']:.3f} ({seconds:.1f} s)", flush=True)

        t = time.perf_counter()
        base = make_model("gbdt")
        base.fit(pick(base_rows), seed=seed)
        score(base, "base (never saw A)", time.perf_counter() - t)
        counts: dict[str, int] = {}
        for i in base_rows:
            counts[samples[i].group] = counts.get(samples[i].group, 0) + 1
        replay = _replayed(counts, set(), replay_size(len(a)), seed=seed)
        kept = set(base_rows)
        old = [i for g in sorted(replay) for i in groups[g] if i in kept]
        for name, extra in (("update", old), ("update, no replay", [])):
            model = copy.deepcopy(base)
            t = time.perf_counter()
            model.update(pick(a + extra), trees=UPDATE_TREES)
            score(model, name, time.perf_counter() - t)
        t = time.perf_counter()
        budgeted = make_model("gbdt", time_budget_s=TRAIN_BUDGET_S / 2)
        budgeted.fit(pick(base_rows + a), seed=seed)
        score(budgeted, "budgeted refit", time.perf_counter() - t)
        if args.full:
            t = time.perf_counter()
            full = make_model("gbdt")
            full.fit(pick(base_rows + a), seed=seed)
            score(full, "full refit", time.perf_counter() - t)
        out["seeds"][seed] = figures
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
