"""What the learned cost model reads from and writes to the database.

- ``training_rows``: every ``ok`` measurement with its structure, config and device — the
  examples a model trains on (failed ones have no time to learn; docs/costmodel.md);
- ``record_measured_space``: a whole measured space at once (a Kernel Tuner cache: one
  program, one structure, one trial and measurement per configuration), in one transaction and
  idempotent (a configuration already there is left alone), so 20k rows take seconds;
- ``tuner_models``: trained models (weights, feature version, the measurements they were
  trained on, their metrics), so a launch on another machine uses the same model.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import (
    DateTime,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
    delete,
    func,
    select,
)
from sqlalchemy.orm import Mapped, defer, mapped_column

from db._models import (
    KEY_LEN,
    MEASUREMENT_STATUSES,
    Base,
    MeasurementRow,
    ProgramRow,
    StructureRow,
    TrialRow,
    utcnow,
)
from db._records import LIBRARY_PREFIX, check_choice, check_key, config_hash, json_text, utc
from kernels import OK

if TYPE_CHECKING:
    from db._store import Database

ALL_DEVICES = "*"  # device_key of a model trained on every device's rows


class CostModelRow(Base):
    """A trained cost model: ``weights`` is ``CostModel.to_bytes()``."""

    __tablename__ = "tuner_models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    device_key: Mapped[str] = mapped_column(String(KEY_LEN))
    feature_version: Mapped[int] = mapped_column(Integer)
    weights: Mapped[bytes] = mapped_column(LargeBinary)
    trained_on_json: Mapped[str] = mapped_column(Text)
    metrics_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


@dataclass(frozen=True)
class TrainingRow:
    measurement_id: int
    program: str
    program_hash: str
    structure_hash: str
    structure: Any  # the structure's JSON object
    config: dict
    device_key: str
    median_s: float


@dataclass(frozen=True)
class ModelRecord:
    id: int
    kind: str
    device_key: str
    feature_version: int
    weights: bytes
    trained_on: dict
    metrics: dict
    created_at: datetime


@dataclass(frozen=True)
class MeasuredConfig:
    """One configuration of a measured space: ``status`` is a measurement status."""

    config: dict
    status: str
    median_s: float | None = None
    message: str | None = None


def _table(model: type) -> Table:
    """A mapped class's Core table (for executemany inserts that skip the ORM)."""
    return cast(Table, model.__table__)  # type: ignore[attr-defined]


def training_rows(database: Database, device_key: str | None = None, *,
                  after: int | None = None, structures: Iterable[str] | None = None
                  ) -> list[TrainingRow]:
    """Every ``ok`` measurement (the first attempt of each trial), oldest first; ``after``:
    only those with a larger id (measured since); ``structures``: only those of these
    structure hashes."""
    stmt = (select(MeasurementRow.id, ProgramRow.name, ProgramRow.program_hash,
                   StructureRow.structure_hash, StructureRow.structure_json, TrialRow.config_json,
                   MeasurementRow.device_key, MeasurementRow.median_s)
            .join(TrialRow, MeasurementRow.trial_id == TrialRow.id)
            .join(StructureRow, TrialRow.structure_id == StructureRow.id)
            .join(ProgramRow, StructureRow.program_id == ProgramRow.id)
            .where(MeasurementRow.status == OK, MeasurementRow.attempt == 0,
                   ~StructureRow.structure_hash.startswith(LIBRARY_PREFIX))  # no kernel
            .order_by(MeasurementRow.id))
    if device_key:
        stmt = stmt.where(MeasurementRow.device_key == device_key)
    if after is not None:
        stmt = stmt.where(MeasurementRow.id > after)
    if structures is not None:
        stmt = stmt.where(StructureRow.structure_hash.in_(sorted(set(structures))))
    graphs: dict[str, Any] = {}
    out = []
    with database.session(write=False) as s:
        for mid, name, phash, shash, sjson, cjson, dkey, median in s.execute(stmt):
            if shash not in graphs:
                graphs[shash] = json.loads(sjson)
            out.append(TrainingRow(mid, name, phash, shash, graphs[shash], json.loads(cjson),
                                   dkey, cast(float, median)))  # ok rows have a median
    return out


@dataclass(frozen=True)
class DatasetRow:
    """One first-attempt measurement with everything a dataset file keeps of it."""

    program: str
    program_hash: str
    shapes: Any
    dtype: str
    program_graph: Any
    structure_hash: str
    structure: Any
    config: dict
    device_key: str
    status: str
    median_s: float | None
    message: str | None


def dataset_rows(database: Database, device_prefix: str | None = None) -> Iterator[DatasetRow]:
    """Every first-attempt measurement of a kernel (``ok`` or failed; no library rows), of the
    devices whose key starts with ``device_prefix``, oldest first: what
    ``costmodel.export_dataset`` writes."""
    stmt = (select(ProgramRow.name, ProgramRow.program_hash, ProgramRow.shapes_key,
                   ProgramRow.dtype, ProgramRow.graph_json, StructureRow.structure_hash,
                   StructureRow.structure_json, TrialRow.config_json, MeasurementRow.device_key,
                   MeasurementRow.status, MeasurementRow.median_s, MeasurementRow.message)
            .join(TrialRow, MeasurementRow.trial_id == TrialRow.id)
            .join(StructureRow, TrialRow.structure_id == StructureRow.id)
            .join(ProgramRow, StructureRow.program_id == ProgramRow.id)
            .where(MeasurementRow.attempt == 0,
                   ~StructureRow.structure_hash.startswith(LIBRARY_PREFIX))
            .order_by(MeasurementRow.id))
    if device_prefix:
        stmt = stmt.where(MeasurementRow.device_key.startswith(device_prefix))
    parsed: dict[str, Any] = {}

    def load(text: str) -> Any:
        if text not in parsed:
            parsed[text] = json.loads(text)
        return parsed[text]

    with database.session(write=False) as s:
        rows = s.execute(stmt).all()
    for (name, phash, skey, dtype, pjson, shash, sjson, cjson, dkey, status, median,
         message) in rows:
        yield DatasetRow(name, phash, load(skey), dtype, load(pjson), shash, load(sjson),
                         json.loads(cjson), dkey, status, median, message)


def measured_structures(database: Database, device_key: str) -> dict[str, int]:
    """Per structure hash, how many ``ok`` first-attempt measurements of ``device_key`` it
    has (the rows ``training_rows`` would give, counted without reading them)."""
    stmt = (select(StructureRow.structure_hash, func.count(MeasurementRow.id))
            .join(TrialRow, MeasurementRow.trial_id == TrialRow.id)
            .join(StructureRow, TrialRow.structure_id == StructureRow.id)
            .where(MeasurementRow.status == OK, MeasurementRow.attempt == 0,
                   MeasurementRow.device_key == device_key,
                   ~StructureRow.structure_hash.startswith(LIBRARY_PREFIX))
            .group_by(StructureRow.structure_hash).order_by(StructureRow.structure_hash))
    with database.session(write=False) as s:
        return {h: int(n) for h, n in s.execute(stmt)}


def newest_measurement_id(database: Database, device_key: str | None = None) -> int:
    stmt = select(func.max(MeasurementRow.id)).where(MeasurementRow.status == OK)
    if device_key:
        stmt = stmt.where(MeasurementRow.device_key == device_key)
    with database.session(write=False) as s:
        return s.execute(stmt).scalar_one() or 0


def record_measured_space(database: Database, *, program_hash: str, shapes: Any, dtype: str,
                          name: str, graph: Any, structure_hash: str, structure: Any,
                          device_key: str, configs: Iterable[MeasuredConfig],
                          host: str | None = None) -> tuple[int, int]:
    """Store a measured space in one transaction; returns (configs added, configs given).
    Configurations already stored for this structure and device are left as they are."""
    device_key = check_key(device_key, "device_key", KEY_LEN)
    host = check_key(host or socket.gethostname(), "host", KEY_LEN)
    rows = list(configs)
    for r in rows:
        check_choice(r.status, "measurement status", MEASUREMENT_STATUSES)
        if r.status == OK and not (r.median_s and r.median_s > 0):
            raise ValueError(f"configuration {r.config}: status ok needs a time > 0")
    program_id = database.record_program(program_hash, shapes, dtype, name, graph)
    structure_id = database.record_structure(program_id, structure_hash, structure,
                                             {"verdict": "imported", "source": name}, 1)
    with database.session() as s:
        known = set(s.execute(select(TrialRow.config_hash).where(
            TrialRow.structure_id == structure_id, TrialRow.device_key == device_key)).scalars())
        now = utcnow()
        fresh: dict[str, MeasuredConfig] = {}
        for r in rows:
            h = config_hash(r.config)
            if h not in known and h not in fresh:
                fresh[h] = r
        if not fresh:
            return 0, len(rows)
        s.execute(_table(TrialRow).insert(), [
            {"structure_id": structure_id, "device_key": device_key, "config_hash": h,
             "config_json": json_text(r.config, "config"), "study_name": None,
             "trial_number": None, "created_at": now} for h, r in fresh.items()])
        ids = dict(s.execute(select(TrialRow.config_hash, TrialRow.id).where(
            TrialRow.structure_id == structure_id, TrialRow.device_key == device_key,
            TrialRow.config_hash.in_(list(fresh)))).all()) if len(fresh) < 30000 else dict(
            s.execute(select(TrialRow.config_hash, TrialRow.id).where(
                TrialRow.structure_id == structure_id, TrialRow.device_key == device_key)).all())
        s.execute(_table(MeasurementRow).insert(), [
            {"trial_id": ids[h], "device_key": device_key, "attempt": 0, "status": r.status,
             "median_s": r.median_s if r.status == OK else None, "spread_s": None,
             "samples_json": None, "max_error": None,
             "message": None if r.message is None else str(r.message)[:2000], "host": host,
             "measured_at": now} for h, r in fresh.items()])
    return len(fresh), len(rows)


def structure_configs(database: Database, structure_id: int) -> list[dict]:
    """The distinct configs stored for a structure, on any device (a space to predict)."""
    stmt = (select(TrialRow.config_hash, TrialRow.config_json).where(
        TrialRow.structure_id == structure_id).distinct().order_by(TrialRow.config_hash))
    with database.session(write=False) as s:
        seen: dict[str, dict] = {}
        for h, text in s.execute(stmt):
            seen.setdefault(h, json.loads(text))
    return list(seen.values())


def save_model(database: Database, *, kind: str, device_key: str, feature_version: int,
               weights: bytes, trained_on: dict, metrics: dict,
               replaces: int | None = None) -> int:
    """Store a model; ``replaces``: the id of one it makes obsolete, deleted in the same
    transaction (a launch's update of an update: each launch would otherwise add a whole
    model, 78 MB for one trained on the CPU dataset)."""
    with database.session() as s:
        row = CostModelRow(kind=check_key(kind, "kind", 32),
                           device_key=check_key(device_key, "device_key", KEY_LEN),
                           feature_version=feature_version, weights=weights,
                           trained_on_json=json_text(trained_on, "trained_on"),
                           metrics_json=json_text(metrics, "metrics"), created_at=utcnow())
        s.add(row)
        s.flush()  # its id first: SQLite would give a deleted newest row's id again
        if replaces is not None:
            s.execute(delete(CostModelRow).where(CostModelRow.id == replaces))
        return row.id


def models(database: Database, device_key: str | None = None, kind: str | None = None,
           with_weights: bool = True) -> list[ModelRecord]:
    """Stored models, newest first; ``device_key`` also matches models of every device."""
    stmt = select(CostModelRow).order_by(CostModelRow.id.desc())
    if not with_weights:  # each launch stores a model (a 98,744-row one is 78 MB)
        stmt = stmt.options(defer(CostModelRow.weights))
    if device_key:
        stmt = stmt.where(CostModelRow.device_key.in_([device_key, ALL_DEVICES]))
    if kind:
        stmt = stmt.where(CostModelRow.kind == kind)
    with database.session(write=False) as s:
        return [ModelRecord(r.id, r.kind, r.device_key, r.feature_version,
                            r.weights if with_weights else b"", json.loads(r.trained_on_json),
                            json.loads(r.metrics_json), utc(r.created_at))
                for r in s.execute(stmt).scalars()]


def best_model(database: Database, device_key: str, kinds: Sequence[str] = (
        "graphsage", "gbdt")) -> ModelRecord | None:
    """The newest model for ``device_key`` (one trained on its own rows before one trained
    on every device), preferring ``kinds`` in order.  Only its weights are read."""
    found = models(database, device_key, with_weights=False)
    for exact in (True, False):
        for kind in kinds:
            for m in found:
                if m.kind == kind and (m.device_key == device_key) == exact:
                    return with_weights(database, m)
    return None


def with_weights(database: Database, record: ModelRecord) -> ModelRecord:
    """``record`` (listed by ``models(with_weights=False)``) with its weights read."""
    with database.session(write=False) as s:
        weights = s.execute(select(CostModelRow.weights).where(
            CostModelRow.id == record.id)).scalar_one()
    return replace(record, weights=weights)
