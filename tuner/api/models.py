"""The learned cost model's loop through a database (docs/costmodel.md): import measurements
made elsewhere, train, evaluate, predict, list — what ``tuner import`` / ``tuner model`` run.
Errors a user can fix are ``InputError``s; nothing is written before the input is checked."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

from .programs import InputError


def import_kernel_tuner(url: str | None, files: list[str]) -> Iterator[dict]:
    """Import Kernel Tuner cache files, yielding each file's counts as it is stored; every
    file is read before anything is written."""
    import costmodel
    import db

    for path in files:
        try:
            costmodel.read_kernel_tuner(path)
        except costmodel.CacheFormatError as err:
            raise InputError(f"{err}; nothing was imported") from None
    with db.connect(url) as database:
        for path in files:
            yield costmodel.import_kernel_tuner(database, path)


def import_dataset(url: str | None, files: list[str]) -> Iterator[dict]:
    """Import dataset files (``costmodel._dataset``'s format, or a ``benchmarks/sweep.py``
    file), yielding each file's counts; every line of every file is checked before anything
    is written, and importing again adds nothing."""
    import costmodel
    import db

    read = []
    for path in files:
        try:
            read.append((path, costmodel.read_dataset(path)))
        except costmodel.DatasetFormatError as err:
            raise InputError(f"{err}; nothing was imported") from None
    with db.connect(url) as database:
        for path, data in read:
            yield {"file": path, **costmodel.import_dataset(database, data)}


def export_dataset(url: str | None, path: str | None, device_prefix: str | None) -> dict:
    """Append the database's measurements the dataset file lacks (default file:
    ``benchmarks/data/dataset_<this cpu>.jsonl.gz``, default devices: ``cpu:``)."""
    import costmodel
    import db

    target = path or str(costmodel.default_path())
    try:
        with db.connect(url, migrate_schema=False) as database:
            return costmodel.export_dataset(database, target, device_prefix=device_prefix)
    except costmodel.DatasetFormatError as err:
        raise InputError(f"{err}; the file was left as it was") from None


def _options(steps: int | None) -> dict:
    if steps is not None and steps < 1:
        raise InputError(f"--steps {steps}: give the number of training steps, >= 1")
    return {"graphsage": {"steps": steps}} if steps else {}


def train_model(url: str | None, *, device_key: str | None = None, kind: str = "gbdt",
                force: bool = False, steps: int | None = None,
                progress: Callable[[str], None] | None = None) -> dict:
    """Train on the database's measurements and store the model there (``costmodel.train``)."""
    import costmodel
    import db

    options = _options(steps)  # bad options fail before the database is opened
    if steps is not None and kind != "graphsage":
        raise InputError(f"--steps {steps}: steps are GraphSAGE's; add --kind graphsage, or "
                         f"drop --steps to train {kind} (the default)")
    with db.connect(url) as database:
        try:
            return costmodel.train(database, device_key=device_key, kind=kind, force=force,
                                   options=options.get(kind), progress=progress)
        except ValueError as err:
            raise InputError(str(err)) from None


def evaluate_model(url: str | None, split: str, *, device_key: str | None = None,
                   steps: int | None = None,
                   progress: Callable[[str], None] | None = None) -> dict:
    """Score GraphSAGE and the baselines on held-out rows (``costmodel.evaluate_database``)."""
    import costmodel
    import db

    options = _options(steps)
    with db.connect(url, migrate_schema=False) as database:
        try:
            return costmodel.evaluate_database(database, split, device_key=device_key,
                                               options=options, progress=progress)
        except ValueError as err:
            raise InputError(str(err)) from None


class Predicted(NamedTuple):
    """What ``tuner model predict`` shows: the stored model's record, every candidate config
    of the program's stored structures with its predicted seconds (fastest first) and, on a
    device the model never trained on, how many of them other devices measured (those are
    ranked by their measurements; None on a trained device)."""

    record: Any
    rows: list[dict]
    siblings_measured: int | None


def siblings_said(found: int, candidates: int) -> str:
    """``tuner.samplers.model.siblings_said``: what ranks a never-trained-on device's configs."""
    from ..samplers.model import siblings_said as said

    return said(found, candidates)


def predict_configs(url: str | None, program: str, overrides: Mapping[str, Any] | None,
                    device_key: str | None) -> Predicted:
    """Rank the program's candidate configs on ``device_key`` with its stored model."""
    import costmodel
    import db

    if not device_key:
        raise InputError("tuner model predict needs --device KEY (see `tuner status` for the "
                         "device keys in the database)")
    with db.connect(url, migrate_schema=False) as database:
        found = costmodel.model_for(database, device_key)
        if found is None:
            raise InputError(f"no trained model for device {device_key!r}: run "
                             f"`tuner model train` first")
        model, record = found
        return Predicted(record, *_ranked(database, model, program, overrides, device_key))


def _ranked(database: Any, model: Any, program: str, overrides: Mapping[str, Any] | None,
            device_key: str) -> tuple[list[dict], int | None]:
    import costmodel
    import db
    from kernels import config_space
    from search import from_obj

    from ..samplers.model import candidate_configs, predicted_order

    profile = costmodel.device_profile(device_key)  # a device the table lacks: its sibling's
    spec = profile.spec
    names = {p.program_id: p.name for p in database.programs()}  # as the training rows name them
    out: list[dict] = []
    measured: int | None = None
    for s in _stored_structures(database, program, overrides):
        obj = s.structure
        if isinstance(obj, dict) and "kernel_tuner" in obj:
            configs = db.structure_configs(database, s.id)
            kt = obj["kernel_tuner"]
            group = costmodel.group_name(s.structure_hash, device_key)
            samples = [costmodel.featurize_params(c, kt["keys"], kt["problem_size"], spec,
                                                  group=group, program=names[s.program_id],
                                                  device=device_key, known_device=profile.known)
                       for c in configs]
            pred = model.predict(samples) if samples else []
            ranked = sorted(zip(configs, pred, strict=True), key=lambda x: x[1])
            found = model.siblings_measured(samples)
        else:
            graph = from_obj(obj)
            space = config_space(graph, spec)
            legal = candidate_configs(space, PREDICT_CANDIDATES, keep=model.sibling_configs(
                names[s.program_id], s.structure_hash, device_key))
            ranked, found = predicted_order(model, graph, legal, spec, device_key,
                                            program=names[s.program_id],
                                            structure_hash=s.structure_hash)
        if found is not None:
            measured = (measured or 0) + found
        out += [{"structure": s.structure_hash, "config": c, "predicted_s": float(p)}
                for c, p in ranked]
    return sorted(out, key=lambda r: r["predicted_s"]), measured


PREDICT_CANDIDATES = 4096  # configs a structure's prediction lowers (milliseconds each)


def _stored_structures(database: Any, program: str, overrides: Mapping[str, Any] | None
                       ) -> list:
    import costmodel
    from search import load_program

    from ..identity import program_key

    imported = [p for p in database.programs() if p.name == program
                and p.dtype == costmodel.KT_DTYPE]
    if imported:
        return [s for p in imported for s in database.structures(p.program_id)]
    key = program_key(load_program(program, overrides))
    pid = database.program_id(key.program_hash, key.shapes, key.dtype)
    if pid is None:
        raise InputError(f"{program} at these shapes is not in the database: launch a "
                         "job with it first (or pass the shapes it was tuned at with --set)")
    return database.structures(pid)


def list_models(url: str | None) -> list[dict]:
    """The stored models (without their weights), newest first, each with the figures
    ``sampler: auto`` weighs: per device, its held-out Kendall tau there and how well the
    other devices' measurements ranked it (``zero_shot``)."""
    import db

    with db.connect(url, migrate_schema=False) as database:
        found = db.models(database, with_weights=False)
    return [{"id": m.id, "kind": m.kind, "device_key": m.device_key, "created_at":
             m.created_at.isoformat(), **m.trained_on,
             "held_out": m.metrics.get("held_out") or {},
             "zero_shot": m.metrics.get("zero_shot") or {},
             **({"update": m.metrics["update"]} if "update" in m.metrics else {})}
            for m in found]
