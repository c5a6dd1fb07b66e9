"""The retrain at a launch's end, on a model trained on many rows: taught what was measured since,
not fitted again.

Fitting again costs what the whole database costs: on the CPU dataset (78,337 rows of one
CPU) 43 s to featurize and ~50 s to boost under the launch's 30 s budget (two fits: the
held-out check and the model), and the model that comes out, its boosting cut at the budget,
is worse than the one ``tuner model train`` made (held-out tau 0.723-0.727 against 0.760 on
the same rows), so ``sampler: auto`` kept the old one and the launch's measurements reached no
model a launch uses.  ``update`` instead loads the full fit behind the model a launch on the
device would use, featurizes only the structures that gained measurements since it was fitted
(all their rows: a ranking needs the whole group) and some it learned before (replayed, so the
new trees do not rewrite the rest), boosts ``UPDATE_TREES`` more trees per booster from its
predictions on them, takes their measured ranks, and stores it under the same device key in
place of the previous update (the full fit and its newest update are kept).

Before teaching it, the model being replaced is scored on the launch's new rows: configs it
never saw, of the programs the user tunes (``metrics["update"]["before"]``).  The held-out
figure ``sampler: auto`` weighs stays the full fit's, not measured again (benchmarks/retrain.py:
on configs of structures it knew, tau moves by -0.010 to -0.021; docs/costmodel.md).

A CPU the model never trained on — the repository's dataset file of one CPU imported and
trained on, launches on another — teaches the model of every device too: its rows are the new
ones, old structures of the CPUs the model knows are replayed, and its held-out figure
there is how the models ranked each launch's rows before learning them.  Measured (a model of
the Intel Xeon file, a Zen 4's launch of 8 new programs, 3 seeds): the next launch's 60 new
programs ranked at tau 0.537-0.590 where a model fitted on the launch's rows alone, what the
retrain made before, gives 0.311-0.436 (docs/costmodel.md)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

import db

from ._devices import spec_for_key
from ._features import FEATURE_VERSION
from ._gbdt import GbdtModel
from ._kinds import load_model
from ._metrics import evaluate
from ._siblings import affinity
from ._store import _finite, samples_from_rows

UPDATE_FROM_ROWS = 5000  # a model trained on fewer rows is fitted again: that is cheap
UPDATE_TREES = 100  # trees added per booster by one update (measured: docs/costmodel.md)
REPLAY, REPLAY_MIN = 2, 2000  # old rows learned again beside the new: this many times as many,
# and at least this many (whole structures, drawn at random)


def update(database: db.Database, device_key: str, *, time_budget_s: float | None = None,
           from_rows: int | None = None, progress: Callable[[str], None] | None = None
           ) -> dict | None:
    """Teach the full fit behind the stored LightGBM model a launch on ``device_key`` would
    use every measurement taken since it was fitted (of each device it trained on, and of
    ``device_key`` where it never did: ``_base``), and store it in place of that model's
    earlier update: always the full fit plus one update's trees, so the model does not grow
    with the launches.  None where there is no such model to teach — none for the current
    features trained on at least ``from_rows`` (default ``UPDATE_FROM_ROWS``) rows, or more
    new rows than it was trained on — and the caller fits one (``costmodel.train``)."""
    chosen = _base(database, device_key, UPDATE_FROM_ROWS if from_rows is None else from_rows)
    if chosen is None:
        return None
    newest = db.newest_measurement_id(database, device_key)
    if newest <= _seen(chosen.trained_on, device_key):
        return {"model_id": chosen.id, "kind": chosen.kind, "device_key": chosen.device_key,
                "trained": False, "updated": False,
                "reason": "up to date: no new measurements since this model was trained",
                **chosen.trained_on}
    full = _full_fit(database, chosen)
    start = time.perf_counter()
    # each update starts from the full fit: a device an earlier update taught it (one it never
    # trained on) is taught again, with this one
    devices = list(dict.fromkeys([*_devices(full), *_devices(chosen), device_key]))
    new = {d: db.training_rows(database, d, after=_seen(full.trained_on, d)) for d in devices}
    count = sum(map(len, new.values()))
    rows_before = int(full.trained_on.get("rows", 0))
    if count > rows_before:
        return None
    touched = {d: {r.structure_hash for r in got} for d, got in new.items() if got}
    if device_key not in touched:  # only measurements the model does not learn from (retries)
        return {"model_id": chosen.id, "kind": chosen.kind, "device_key": chosen.device_key,
                "trained": False, "updated": False,
                "reason": "up to date: no new measurements to learn from",
                **chosen.trained_on}
    # replayed: structures the full fit learned, of this device, or where it never saw this
    # one, of the devices of its kind it trained on (not a GPU's Kernel Tuner spaces for a CPU)
    known = device_key in _devices(full)
    kin = [device_key] if known else [d for d in _devices(full) if affinity(device_key, d) > 0]
    pool = {(d, h): n for d in kin for h, n in db.measured_structures(database, d).items()}
    replayed: dict[str, set[str]] = {}
    for d, h in _replayed(pool, {(d, h) for d, hs in touched.items() for h in hs},
                          replay_size(count), seed=newest):
        replayed.setdefault(d, set()).add(h)
    rows = [r for d in dict.fromkeys([*touched, *replayed]) for r in db.training_rows(
        database, d, structures=touched.get(d, set()) | replayed.get(d, set()))]
    if progress:
        progress(f"teaching model {full.id} the {count} measurements since it was fitted "
                 f"({len(rows)} rows of {sum(map(len, touched.values()))} structures and "
                 f"{sum(map(len, replayed.values()))} it learned before)"
                 + ("" if known else f"; it never trained on {device_key}"))
    samples = samples_from_rows(rows)
    fresh = {r.measurement_id for got in new.values() for r in got}
    mine = {r.measurement_id for r in new[device_key]}
    model = load_model(db.with_weights(database, full).weights)
    if not isinstance(model, GbdtModel):
        return None
    # how the model it replaces ranked this launch's rows, before it learned them
    unseen = [s for s, r in zip(samples, rows, strict=True) if r.measurement_id in mine
              and r.measurement_id > _seen(chosen.trained_on, device_key)]
    used = model if chosen.id == full.id else load_model(db.with_weights(database, chosen).weights)
    before = _finite(evaluate([s.group for s in unseen], [s.seconds for s in unseen],
                              used.predict(unseen)))
    model.update(samples, trees=UPDATE_TREES, time_budget_s=time_budget_s, progress=progress)
    seconds = round(time.perf_counter() - start, 2)
    trained_on = {**full.trained_on, "rows": rows_before + count, "devices": devices,
                  "newest_measurement": max(int(full.trained_on.get("newest_measurement", 0)),
                                            max(fresh)),
                  # per device: a device's rows measured before another device's update are
                  # still new to it
                  "newest_by_device": {d: max([_seen(full.trained_on, d)]
                                              + [r.measurement_id for r in new[d]])
                                       for d in devices},
                  "full_fit": full.id, "updates": int(chosen.trained_on.get("updates", 0)) + 1,
                  "seconds": seconds}
    metrics = {**full.metrics, "held_out": _held_out(full, chosen, device_key, before),
               "update": {"from": chosen.id, "rows": count, "launch_rows": len(unseen),
                          "groups": sum(map(len, touched.values())), "before": before}}
    replaces = chosen.id if chosen.id != full.id else None  # the full fit's earlier update
    model_id = db.save_model(database, kind=full.kind, device_key=full.device_key,
                             feature_version=FEATURE_VERSION, weights=model.to_bytes(),
                             trained_on=trained_on, metrics=metrics, replaces=replaces)
    return {"model_id": model_id, "kind": full.kind, "device_key": full.device_key,
            "trained": True, "updated": True, "from": chosen.id, "full_fit": full.id,
            "new_rows": len(unseen), "since_full_fit": count, "rows": trained_on["rows"],
            "new_device": not known,
            "seconds": seconds, "before": before, "held_out": metrics["held_out"]}


def _base(database: db.Database, device_key: str, from_rows: int) -> db.ModelRecord | None:
    """The LightGBM model to teach: of the newest of the device's own and the newest of every
    device (what a launch weighs), with the current features and at least ``from_rows``
    rows, the one trained on the device on more rows; where none trained on it, the model of
    every device (a CPU's dataset file imported and trained on, a launch on another CPU: its
    rows teach that model, not a model fitted on one launch's rows) where it trained on a CPU
    (a model of Kernel Tuner caches knows nothing of a CPU's µGraphs); None where neither.  A
    GPU no model trained on is not taught: its siblings' measurements rank it (``_siblings``;
    measured, no correction from a launch's few rows beat their order, docs/costmodel.md)."""
    newest: dict[str, db.ModelRecord] = {}
    for m in db.models(database, device_key, "gbdt", with_weights=False):
        newest.setdefault(m.device_key, m)
    fit = [m for m in newest.values() if m.feature_version == FEATURE_VERSION
           and int(m.trained_on.get("rows", 0)) >= from_rows]
    pool = [m for m in fit if device_key in _devices(m)]
    if not pool and spec_for_key(device_key).kind == "cpu":
        pool = [m for m in fit if m.device_key == db.ALL_DEVICES
                and any(affinity(device_key, d) > 0 for d in _devices(m))]
    return max(pool, key=lambda m: (int(m.trained_on.get("rows", 0)), m.id), default=None)


def _devices(model: db.ModelRecord) -> list[str]:
    return list(model.trained_on.get("devices", ()))


def _held_out(full: db.ModelRecord, chosen: db.ModelRecord, device_key: str,
              before: dict) -> dict:
    """The full fit's held-out figures, and on a device it never trained on how the models
    taught its rows ranked them before learning them (configs they never saw): the mean of
    each launch's figure weighted by its configs, so one launch of a few configs does not
    decide it."""
    held_out = dict(full.metrics.get("held_out") or {})
    if device_key in held_out:
        return held_out
    was = (chosen.metrics.get("held_out") or {}).get(device_key) if chosen.id != full.id else None
    figures = [f for f in (was, before) if f and f.get("kendall_tau") is not None]
    n = sum(int(f.get("n", 0)) for f in figures)
    if n:
        held_out[device_key] = {
            "kendall_tau": sum(f["kendall_tau"] * int(f.get("n", 0)) for f in figures) / n,
            "n": n, "launches": sum(int(f.get("launches", 1)) for f in figures),
            "measured": "before learning them: configs the model never saw"}
    for d in _devices(chosen):  # another device an earlier update taught keeps its figure
        if d not in held_out and d in (chosen.metrics.get("held_out") or {}):
            held_out[d] = chosen.metrics["held_out"][d]
    return held_out


def _full_fit(database: db.Database, model: db.ModelRecord) -> db.ModelRecord:
    """The full fit an update was made from (itself for a full fit; the update itself where
    its full fit was deleted: it is then taught as if it were one)."""
    fit = model.trained_on.get("full_fit")
    if fit is None:
        return model
    found = [m for m in db.models(database, model.device_key, model.kind, with_weights=False)
             if m.id == fit]
    return found[0] if found else model


def replay_size(new_rows: int) -> int:
    """How many old rows are learned again beside ``new_rows`` new ones (``REPLAY``,
    ``REPLAY_MIN``): the one rule the retrain and its benchmarks follow."""
    return max(REPLAY_MIN, REPLAY * new_rows)


def _replayed(counts: dict[Any, int], touched: set, rows: int, *, seed: int) -> set:
    """Structures the model learned before, drawn at random (seeded) until they hold
    ``rows`` rows: learned again beside the new ones, they keep the added trees from
    rewriting what the model knew of the rest."""
    rng = np.random.default_rng(seed)
    old = sorted(h for h in counts if h not in touched)
    picked: set[str] = set()
    total = 0
    for i in rng.permutation(len(old)):
        if total >= rows:
            break
        picked.add(old[i])
        total += counts[old[i]]
    return picked


def _seen(trained_on: dict, device_key: str) -> int:
    """The newest measurement id of ``device_key`` the model has learned from (0: it never
    trained on the device)."""
    if device_key not in trained_on.get("devices", (device_key,)):
        return 0
    return int(trained_on.get("newest_by_device", {}).get(
        device_key, trained_on.get("newest_measurement", 0)))
