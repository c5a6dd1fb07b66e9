"""The loop through the database: measurements in, a trained model out, and back again.

``import_kernel_tuner`` stores a Kernel Tuner cache as a measured space; ``train`` reads every
``ok`` measurement (``db.training_rows``), fits a model and stores it in ``tuner_models`` with
what it was trained on; ``evaluate_database`` scores the model kinds on the database's rows;
``model_for`` loads the model a launch should use for a device.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import db
from kernels import COMPILE_ERROR, OK, RUNTIME_ERROR, DeviceSpec
from search.ir import KernelGraph, from_obj

from ._data import read_kernel_tuner, spec_for_key
from ._evaluate import cross_validate
from ._features import FEATURE_VERSION, Sample, featurize, featurize_params
from ._metrics import evaluate
from ._models import CostModel, load_model, make_model

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
    """Features of stored measurements (each structure lowered once per config)."""
    graphs: dict[str, KernelGraph] = {}
    specs: dict[str, DeviceSpec] = {}
    out = []
    for r in rows:
        spec = specs.get(r.device_key) or specs.setdefault(r.device_key,
                                                           spec_for_key(r.device_key))
        group = f"{r.structure_hash[:16]}@{r.device_key}"
        kt = r.structure.get("kernel_tuner") if isinstance(r.structure, dict) else None
        if kt:
            s = featurize_params(r.config, kt["keys"], kt["problem_size"], spec, group=group,
                                 program=r.program, device=r.device_key)
        else:
            graph = graphs.get(r.structure_hash) or graphs.setdefault(
                r.structure_hash, from_obj(r.structure))
            s = featurize(graph, r.config, spec, group=group, program=r.program,
                          device=r.device_key)
        s.seconds = r.median_s
        out.append(s)
    return out


def train(database: db.Database, *, device_key: str | None = None, kind: str = "graphsage",
          force: bool = False, options: dict | None = None,
          progress: Callable[[str], None] | None = None) -> dict:
    """Fit ``kind`` on the database's measurements (of ``device_key``, or all) and store it.

    Incremental: when the newest stored model of this kind and device was trained on every
    measurement there is now, nothing is trained (``force`` trains anyway)."""
    key = device_key or db.ALL_DEVICES
    newest = db.newest_measurement_id(database, device_key)
    if newest == 0:
        raise ValueError("no ok measurements in the database to train on"
                         + (f" for device {device_key!r}" if device_key else "")
                         + ": launch a job or `tuner import kernel-tuner FILE` first")
    last = next((m for m in db.models(database, device_key, kind, with_weights=False)
                 if m.device_key == key), None)
    if (last and not force and last.trained_on.get("newest_measurement") == newest
            and last.feature_version == FEATURE_VERSION):
        return {"model_id": last.id, "kind": kind, "device_key": key, "trained": False,
                "reason": "up to date: no new measurements since this model was trained",
                **last.trained_on}
    start = time.perf_counter()
    rows = db.training_rows(database, device_key)
    if progress:
        progress(f"featurizing {len(rows)} measurements")
    samples = samples_from_rows(rows)
    model = make_model(kind, **(options or {}))
    model.fit(samples, progress=progress)
    fit_s = time.perf_counter() - start
    metrics = evaluate([s.group for s in samples], [s.seconds for s in samples],
                       model.predict(samples))
    trained_on = {"rows": len(samples), "newest_measurement": newest,
                  "devices": sorted({s.device for s in samples}),
                  "programs": len({s.program for s in samples}), "seconds": round(fit_s, 2)}
    model_id = db.save_model(database, kind=kind, device_key=key,
                             feature_version=FEATURE_VERSION, weights=model.to_bytes(),
                             trained_on=trained_on, metrics={"train": metrics})
    return {"model_id": model_id, "kind": kind, "device_key": key, "trained": True,
            **trained_on, "train_metrics": metrics}


def evaluate_database(database: db.Database, split: str, *, device_key: str | None = None,
                      kinds: Sequence[str] = ("graphsage", "roofline", "gbdt"),
                      options: dict | None = None,
                      progress: Callable[[str], None] | None = None) -> dict:
    """``tuner model eval``: GraphSAGE on the split's folds, the baselines beside it."""
    samples = samples_from_rows(db.training_rows(database, device_key))
    if not samples:
        raise ValueError("no ok measurements in the database to evaluate on")
    result = cross_validate(samples, split, kinds, options=options, progress=progress)
    main = kinds[0]
    folds = [f for f in result["folds"][main] if f is not None]
    return {"split": split, "model": main, "rows": len(samples), "folds": folds,
            "mean": result["mean"][main],
            "baselines": {k: result["mean"][k] for k in kinds[1:]}}


def model_for(database: db.Database, device_key: str) -> tuple[CostModel, db.ModelRecord] | None:
    """The stored model a launch on ``device_key`` uses (None: there is none)."""
    record = db.best_model(database, device_key)
    if record is None or record.feature_version != FEATURE_VERSION:
        return None
    return load_model(record.weights), record

