"""The loop through the database: measurements in, a trained model out, and back again.

``import_kernel_tuner`` stores a Kernel Tuner cache as a measured space; ``train`` reads every
``ok`` measurement (``db.training_rows``), fits a model and stores it in ``tuner_models`` with
what it was trained on; ``evaluate_database`` scores the model kinds on the database's rows;
``model_for`` loads the model a launch should use for a device.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

import db
from kernels import COMPILE_ERROR, OK, RUNTIME_ERROR
from search.ir import KernelGraph, from_obj

from ._data import read_kernel_tuner
from ._devices import DeviceProfile, device_profile, unknown_devices
from ._evaluate import cross_validate
from ._features import (
    FEATURE_VERSION,
    Sample,
    StoredConfigs,
    featurize,
    featurize_params,
    group_name,
)
from ._kinds import MIN_FIT_ROWS, load_model, make_model
from ._metrics import evaluate, first_k
from ._models import CostModel

KT_DTYPE = "kernel_tuner"  # the dtype column of an imported Kernel Tuner space
# Kernel Tuner's failure markers -> our measurement statuses (a marker not here: RUNTIME_ERROR);
# tuner's replay of a Kernel Tuner space reads the same table
KT_STATUS = {"CompilationFailedConfig": COMPILE_ERROR, "RuntimeFailedConfig": RUNTIME_ERROR,
             "InvalidConfig": RUNTIME_ERROR}


def import_kernel_tuner(database: db.Database, path: str | Path) -> dict:
    """Store one cache file: a program per kernel and problem size, one structure (the kernel
    itself), one trial and measurement per configuration on ``replay:<GPU>``.  Idempotent."""
    space = read_kernel_tuner(path)
    program = {"kernel_tuner": {"kernel": space.kernel, "keys": list(space.keys),
                                "problem_size": list(space.problem_size)}}
    phash = hashlib.sha256(json.dumps(program, sort_keys=True).encode()).hexdigest()
    configs = []
    for config, seconds, marker in zip(space.configs, space.times_s, space.failures,
                                       strict=True):
        if math.isnan(seconds):
            status = KT_STATUS.get(str(marker), RUNTIME_ERROR)
            configs.append(db.MeasuredConfig(config, status, None, str(marker)))
        else:
            configs.append(db.MeasuredConfig(config, OK, seconds))
    added, total = db.record_measured_space(
        database, program_hash=phash, shapes={"problem_size": list(space.problem_size)},
        dtype=KT_DTYPE, name=space.kernel, graph=program, structure_hash=phash,
        structure=program, device_key=space.device_key, configs=configs)
    return {"file": str(path), "kernel": space.kernel, "device_key": space.device_key,
            "configs": total, "added": added, "ok": sum(c.status == OK for c in configs)}


def samples_from_rows(rows: Sequence[db.TrainingRow]) -> list[Sample]:
    """Features of stored measurements (each structure lowered once per config; a µGraph
    config named by its kernel, ``StoredConfigs``)."""
    graphs: dict[str, KernelGraph] = {}
    profiles: dict[str, DeviceProfile] = {}
    stored = StoredConfigs()
    # the bound graphs of the structure at hand by symbols (``concretize``): a structure's rows
    # come together (measured together), and keeping every structure's would hold them all
    binds: dict = {}
    binds_of = None
    out = []
    for r in rows:
        if r.structure_hash != binds_of:
            binds, binds_of = {}, r.structure_hash
        p = profiles.get(r.device_key) or profiles.setdefault(r.device_key,
                                                              device_profile(r.device_key))
        group = group_name(r.structure_hash, r.device_key)
        kt = r.structure.get("kernel_tuner") if isinstance(r.structure, dict) else None
        if kt:
            s = featurize_params(r.config, kt["keys"], kt["problem_size"], p.spec, group=group,
                                 program=r.program, device=r.device_key, known_device=p.known)
        else:
            graph = graphs.get(r.structure_hash) or graphs.setdefault(
                r.structure_hash, from_obj(r.structure))
            s = featurize(graph, r.config, p.spec, group=group, program=r.program,
                          device=r.device_key, known_device=p.known,
                          binds=binds)
            s.config = stored.canonical(graph, r.structure_hash, p.spec, s.config)
        s.seconds = r.median_s
        out.append(s)
    return out


def train(database: db.Database, *, device_key: str | None = None, kind: str = "gbdt",
          force: bool = False, options: dict | None = None,
          progress: Callable[[str], None] | None = None, min_rows: int = MIN_FIT_ROWS) -> dict:
    """Fit ``kind`` on the database's measurements (of ``device_key``, or all) and store it.

    Incremental: when the newest stored model of this kind and device was trained on every
    measurement there is now, nothing is trained (``force`` trains anyway)."""
    key = device_key or db.ALL_DEVICES
    newest = db.newest_measurement_id(database, device_key)
    if newest == 0:
        raise _no_rows("train on", device_key)
    last = next((m for m in db.models(database, device_key, kind, with_weights=False)
                 if m.device_key == key), None)
    if (last and not force and last.trained_on.get("newest_measurement") == newest
            and last.feature_version == FEATURE_VERSION
            and "full_fit" not in last.trained_on):  # a launch's update: fit it in full
        return {"model_id": last.id, "kind": kind, "device_key": key, "trained": False,
                "reason": "up to date: no new measurements since this model was trained",
                **last.trained_on}
    start = time.perf_counter()
    rows = db.training_rows(database, device_key)
    if len(rows) < max(min_rows, MIN_FIT_ROWS):
        raise ValueError(f"{len(rows)} ok measurement(s)" + (f" of {device_key}" if device_key
                                                              else "")
                         + f": fewer than {max(min_rows, MIN_FIT_ROWS)}, too few to learn from "
                         "yet; " + _MEASURE_MORE)
    if progress:
        progress(f"featurizing {len(rows)} measurements")
    samples = samples_from_rows(rows)
    held_out = held_out_metrics(samples, kind, options, progress=progress)
    model = make_model(kind, **(options or {}))
    model.fit(samples, progress=progress)
    fit_s = time.perf_counter() - start
    metrics = _finite(evaluate([s.group for s in samples], [s.seconds for s in samples],
                               model.predict(samples)))
    zero_shot = zero_shot_metrics(model, samples)
    devices = sorted({s.device for s in samples})
    trained_on = {"rows": len(samples), "newest_measurement": newest, "devices": devices,
                  "programs": len({s.program for s in samples}), "seconds": round(fit_s, 2)}
    model_id = db.save_model(database, kind=kind, device_key=key,
                             feature_version=FEATURE_VERSION, weights=model.to_bytes(),
                             trained_on=trained_on,
                             metrics={"train": metrics, "held_out": held_out,
                                      "zero_shot": zero_shot})
    return {"model_id": model_id, "kind": kind, "device_key": key, "trained": True,
            **trained_on, "train_metrics": metrics, "held_out": held_out,
            "zero_shot": zero_shot,
            "unknown_devices": unknown_devices(devices)}


HELD_OUT = 0.2  # of each device's rows, held out to measure the model ``sampler: auto`` trusts
ZERO_SHOT_FIRST = 10  # the top of the siblings' order ``zero_shot_metrics`` scores (a third of a
# study's 30 trials by default)


def held_out_metrics(samples: Sequence[Sample], kind: str, options: dict | None = None, *,
                     seed: int = 0, progress: Callable[[str], None] | None = None
                     ) -> dict[str, dict]:
    """Per device, the metrics of a model of ``kind`` trained on the other 80% of the rows
    and scored on a seeded 20% it never saw (configs of structures it saw: the random split);
    only devices with at least 10 rows, and only figures that exist (tau needs two held-out
    configs of one group).  What ``sampler: auto`` compares with its threshold."""
    rng = np.random.default_rng(seed)
    test = rng.random(len(samples)) < HELD_OUT
    by_device: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        by_device.setdefault(s.device, []).append(i)
    if test.all() or not test.any() or all(len(v) < 10 for v in by_device.values()):
        return {}
    model = make_model(kind, **(options or {}))
    if progress:
        progress(f"held-out check: {kind} on {int((~test).sum())} rows, "
                 f"scored on {int(test.sum())}")
    model.fit([s for s, t in zip(samples, test, strict=True) if not t], seed=seed)
    out = {}
    for device, idx in by_device.items():
        held = [samples[i] for i in idx if test[i]]
        if len(idx) < 10 or len(held) < 2:
            continue
        out[device] = _finite(evaluate([s.group for s in held], [s.seconds for s in held],
                                       model.predict(held)))
    return out


def zero_shot_metrics(model: CostModel, samples: Sequence[Sample]) -> dict[str, dict]:
    """Per training device, how well the other devices' measurements rank its configs, its
    own left out: what ranks a device the model never trained on (``_siblings``), measured
    where it can be, so that ``sampler: auto`` can trust the model on a new device of a
    vendor runtime whose devices its siblings rank well.  The siblings' order alone (the
    trees saw the device); only devices with at least 10 configs another device measured.
    ``first``: where a space has more than ``ZERO_SHOT_FIRST`` configs, how near the optimum
    the order's first ones come against as many random draws (``first_k``) — the top of the
    order, which a tuner measures, where tau weighs the whole space."""
    by_device: dict[str, list[Sample]] = {}
    for s in samples:
        by_device.setdefault(s.device, []).append(s)
    measured = getattr(model, "measured", None)
    out: dict[str, dict] = {}
    if measured is None:  # the roofline ranks by no measurement
        return out
    for device, rows in by_device.items():
        z = measured.ranks(rows)  # a device's own scores never rank it
        kept = [(s, v) for s, v in zip(rows, z, strict=True) if math.isfinite(v)]
        if len(kept) < 10:
            continue
        groups, times = [s.group for s, _ in kept], [s.seconds for s, _ in kept]
        order = np.asarray([v for _, v in kept])
        got = _finite(evaluate(groups, times, np.exp(order)))
        if "kendall_tau" in got:  # ranks, not times: no MAPE
            first = first_k(groups, times, order, ZERO_SHOT_FIRST)
            out[device] = {k: v for k, v in got.items() if k != "mape"} | {
                "configs": len(kept)} | ({"first": first} if first else {})
    return out


def _finite(metrics: dict) -> dict:
    """Only the figures that exist (tau needs two configs of one group): NaN is not JSON."""
    return {k: v for k, v in metrics.items() if not (isinstance(v, float) and math.isnan(v))}


_MEASURE_MORE = "launch a job or `tuner import kernel-tuner FILE` first"


def _no_rows(doing: str, device_key: str | None) -> ValueError:
    return ValueError(f"no ok measurements in the database to {doing}"
                      + (f" for device {device_key!r} (`tuner status` lists the devices "
                         "measured)" if device_key else "") + f"; {_MEASURE_MORE}")


def evaluate_database(database: db.Database, split: str, *, device_key: str | None = None,
                      kinds: Sequence[str] = ("graphsage", "roofline", "gbdt"),
                      options: dict | None = None,
                      progress: Callable[[str], None] | None = None) -> dict:
    """``tuner model eval``: GraphSAGE on the split's folds, the baselines beside it."""
    samples = samples_from_rows(db.training_rows(database, device_key))
    if not samples:
        raise _no_rows("evaluate on", device_key)
    result = cross_validate(samples, split, kinds, options=options, progress=progress)
    main = kinds[0]
    folds = [f for f in result["folds"][main] if f is not None]
    return {"split": split, "model": main, "rows": len(samples), "folds": folds,
            "unknown_devices": unknown_devices({s.device for s in samples}),
            "mean": result["mean"][main],
            "baselines": {k: result["mean"][k] for k in kinds[1:]}}


# Stored models unpickled in this process, by record.  A launch asks for its model once per
# program and device, twice (the device's own and every device's, often the same record): a
# 1,200-tree model (78 MB) took 0.5 s to unpickle each time, 4.2 s of a 4-program launch.
_LOADED: dict[tuple, CostModel] = {}
_LOADED_MAX = 4


def model_for(database: db.Database, device_key: str) -> tuple[CostModel, db.ModelRecord] | None:
    """The stored model a launch on ``device_key`` uses (None: there is none): a copy of its
    own, so what one study adapts (``CostModel.adapt``) is not another's."""
    record = db.best_model(database, device_key)
    if record is None or record.feature_version != FEATURE_VERSION:
        return None
    key = (database.url, record.id, record.created_at, len(record.weights))
    model = _LOADED.get(key)
    if model is None:
        if len(_LOADED) >= _LOADED_MAX:
            _LOADED.clear()
        model = _LOADED[key] = load_model(record.weights)
    mine = copy.copy(model)
    mine.offsets, mine.mixes = dict(model.offsets), dict(model.mixes)
    return mine, record

