"""The retrain at a launch's end, on a model trained on many rows: taught what was measured since,
not fitted again.

Fitting again costs what the whole database costs: on the CPU dataset (78,337 rows of one
CPU) 43 s to featurize and ~50 s to boost under the launch's 30 s budget (two fits: the
held-out check and the model), and the model that comes out, its boosting cut at the budget,
is worse than the one ``tuner model train`` made (held-out tau 0.724 against 0.760 on the
same rows), so ``sampler: auto`` kept the old one and the launch's measurements reached no
model a launch uses.  ``update`` instead loads the model a launch on the device would use,
featurizes only the structures that gained measurements (all their rows: a ranking needs the
whole group), boosts ``UPDATE_TREES`` more trees per booster from its predictions on them and
takes their measured ranks, and stores it as a model of the same device key, replacing the
previous update of the same base (a full model and its newest update are kept).

Before teaching it, the model is scored on the new rows: configs it never saw, of the
programs the user tunes — what the launch would have gained from it (``metrics["update"]``).
The held-out figure ``sampler: auto`` weighs stays the base's (the update trains on no row of
the base's held-out split but the touched groups' own)."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

import db

from ._features import FEATURE_VERSION
from ._gbdt import GbdtModel
from ._kinds import load_model
from ._metrics import evaluate
from ._store import _finite, samples_from_rows

UPDATE_FROM_ROWS = 5000  # a model trained on fewer rows is fitted again: that is cheap
UPDATE_TREES = 100  # trees added per booster by one update (measured: docs/costmodel.md)
REPLAY, REPLAY_MIN = 2, 2000  # old rows learned again beside the new: this many times as many,
# and at least this many (whole structures, drawn at random)


def update(database: db.Database, device_key: str, *, time_budget_s: float | None = None,
           from_rows: int | None = None, progress: Callable[[str], None] | None = None
           ) -> dict | None:
    """Teach the stored LightGBM model a launch on ``device_key`` would use the measurements
    of ``device_key`` taken since it was trained, and store it.  None where there is no such
    model to teach — none trained on the device, one for older features, one trained on
    fewer than ``from_rows`` (default ``UPDATE_FROM_ROWS``) rows, or more new rows than it
    was trained on — and the caller fits one (``costmodel.train``)."""
    base = _base(database, device_key, UPDATE_FROM_ROWS if from_rows is None else from_rows)
    if base is None:
        return None
    since = _seen(base.trained_on, device_key)
    newest = db.newest_measurement_id(database, device_key)
    rows_before = int(base.trained_on.get("rows", 0))
    if newest <= since:
        return {"model_id": base.id, "kind": base.kind, "device_key": base.device_key,
                "trained": False, "updated": False,
                "reason": "up to date: no new measurements since this model was trained",
                **base.trained_on}
    start = time.perf_counter()
    new = db.training_rows(database, device_key, after=since)
    if not new or len(new) > rows_before:
        return None
    touched = {r.structure_hash for r in new}
    replayed = _replayed(db.measured_structures(database, device_key), touched,
                         max(REPLAY_MIN, REPLAY * len(new)), seed=newest)
    rows = db.training_rows(database, device_key, structures=touched | replayed)
    if progress:
        progress(f"teaching model {base.id} {len(new)} new measurements ({len(rows)} rows of "
                 f"{len(touched)} structures and {len(replayed)} it learned before)")
    samples = samples_from_rows(rows)
    fresh = {r.measurement_id for r in new}
    new_samples = [s for s, r in zip(samples, rows, strict=True) if r.measurement_id in fresh]
    model = load_model(db.with_weights(database, base).weights)
    if not isinstance(model, GbdtModel):
        return None
    before = _finite(evaluate([s.group for s in new_samples], [s.seconds for s in new_samples],
                              model.predict(new_samples)))
    model.update(samples, trees=UPDATE_TREES, time_budget_s=time_budget_s,
                 progress=progress)
    seconds = round(time.perf_counter() - start, 2)
    trained_on = {**base.trained_on, "rows": rows_before + len(new),
                  "newest_measurement": max(int(base.trained_on.get("newest_measurement", 0)),
                                            newest),
                  # per device: a launch on another device must still find its rows measured
                  # between the full fit and this update new
                  "newest_by_device": {**{d: _seen(base.trained_on, d)
                                          for d in base.trained_on.get("devices", ())},
                                       device_key: newest},
                  "full_fit": base.trained_on.get("full_fit", base.id),
                  "updates": int(base.trained_on.get("updates", 0)) + 1,
                  "seconds": seconds}
    metrics = {**base.metrics, "update": {"from": base.id, "rows": len(new),
                                          "groups": len(touched), "before": before}}
    replaces = base.id if "full_fit" in base.trained_on else None  # an update's update
    model_id = db.save_model(database, kind=base.kind, device_key=base.device_key,
                             feature_version=FEATURE_VERSION, weights=model.to_bytes(),
                             trained_on=trained_on, metrics=metrics, replaces=replaces)
    return {"model_id": model_id, "kind": base.kind, "device_key": base.device_key,
            "trained": True, "updated": True, "from": base.id, "new_rows": len(new),
            "rows": trained_on["rows"], "seconds": seconds, "before": before,
            "held_out": base.metrics.get("held_out", {})}


def _base(database: db.Database, device_key: str, from_rows: int) -> db.ModelRecord | None:
    """The LightGBM model to teach: of the newest of the device's own and the newest of every
    device (what a launch weighs), those trained on the device with the current features,
    the one trained on more rows; None where that is fewer than ``from_rows``."""
    newest: dict[str, db.ModelRecord] = {}
    for m in db.models(database, device_key, "gbdt", with_weights=False):
        newest.setdefault(m.device_key, m)
    fit = [m for m in newest.values() if m.feature_version == FEATURE_VERSION
           and device_key in m.trained_on.get("devices", ())]
    best = max(fit, key=lambda m: (int(m.trained_on.get("rows", 0)), m.id), default=None)
    if best is None or int(best.trained_on.get("rows", 0)) < from_rows:
        return None
    return best


def _replayed(counts: dict[str, int], touched: set[str], rows: int, *, seed: int) -> set[str]:
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
    """The newest measurement id of ``device_key`` the model has learned from."""
    return int(trained_on.get("newest_by_device", {}).get(
        device_key, trained_on.get("newest_measurement", 0)))
