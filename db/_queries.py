"""Read-side queries. Each is a few indexed lookups; none writes.

The best-kernel lookup is a point query on the unique key of ``tuner_best_kernels`` plus two
primary-key joins, run through SQLAlchemy Core (no ORM identity map) on a pooled connection, so
that ``tuner best`` stays in the low milliseconds however many measurements the database holds.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Engine, bindparam, case, func, select

from db._models import (
    BestKernelRow,
    JobRow,
    MeasurementRow,
    ProgramRow,
    SearchShardRow,
    StructureRow,
    TrialRow,
)
from db._records import (
    BestKernel,
    HistoryEntry,
    JobRecord,
    MeasurementRecord,
    ProgramSummary,
    StructureRecord,
    loads,
    shapes_key,
    utc,
)
from kernels import OK

_B, _S, _T = BestKernelRow.__table__.c, StructureRow.__table__.c, TrialRow.__table__.c

# Built once with bind parameters and plain table columns: reusing one statement object skips
# SQLAlchemy's per-call construction and result-metadata adaptation, which dominated the lookup.
_BEST_BY_KEY = (
    select(
        _B.program_hash,
        _B.shapes_key,
        _B.dtype,
        _B.device_key,
        _B.structure_id,
        _S.structure_hash,
        _S.structure_json,
        _B.trial_id,
        _T.config_json,
        _B.measurement_id,
        _B.source,
        _B.time_s,
        _B.baseline_s,
        _B.updated_at,
        _B.uncertain,
    )
    .select_from(BestKernelRow.__table__)
    .join(StructureRow.__table__, _S.id == _B.structure_id)
    .join(TrialRow.__table__, _T.id == _B.trial_id)
    .where(
        _B.program_hash == bindparam("program_hash"),
        _B.shapes_key == bindparam("shapes_key"),
        _B.dtype == bindparam("dtype"),
    )
)
_BEST_ON_DEVICE = _BEST_BY_KEY.where(_B.device_key == bindparam("device_key"))
_BEST_ALL_DEVICES = _BEST_BY_KEY.order_by(_B.time_s, _B.id)
_BEST_ANY_DEVICE = _BEST_ALL_DEVICES.limit(1)


def _best_record(row: Any) -> BestKernel:
    return BestKernel(
        program_hash=row.program_hash,
        shapes_key=row.shapes_key,
        dtype=row.dtype,
        device_key=row.device_key,
        structure_id=row.structure_id,
        structure_hash=row.structure_hash,
        structure=loads(row.structure_json),
        trial_id=row.trial_id,
        config=loads(row.config_json),
        measurement_id=row.measurement_id,
        source=row.source,
        time_s=row.time_s,
        baseline_s=row.baseline_s,
        updated_at=utc(row.updated_at),
        uncertain=row.uncertain,
    )


def fetch_best_kernel(
    conn: Connection, program_hash: str, shapes: Any, dtype: str, device_key: str | None
) -> BestKernel | None:
    params = {"program_hash": program_hash, "shapes_key": shapes_key(shapes), "dtype": dtype}
    if device_key is None:
        row = conn.execute(_BEST_ANY_DEVICE, params).first()
    else:
        row = conn.execute(_BEST_ON_DEVICE, {**params, "device_key": device_key}).first()
    return None if row is None else _best_record(row)


def fetch_best_kernels(
    conn: Connection, program_hash: str, shapes: Any, dtype: str
) -> list[BestKernel]:
    params = {"program_hash": program_hash, "shapes_key": shapes_key(shapes), "dtype": dtype}
    return [_best_record(row) for row in conn.execute(_BEST_ALL_DEVICES, params)]


def fetch_program_id(conn: Connection, program_hash: str, shapes: Any, dtype: str) -> int | None:
    return conn.execute(
        select(ProgramRow.id).where(
            ProgramRow.program_hash == program_hash,
            ProgramRow.shapes_key == shapes_key(shapes),
            ProgramRow.dtype == dtype,
        )
    ).scalar_one_or_none()


def fetch_structures(conn: Connection, program_id: int) -> list[StructureRecord]:
    rows = conn.execute(
        select(StructureRow).where(StructureRow.program_id == program_id).order_by(StructureRow.id)
    ).all()
    return [
        StructureRecord(
            id=r.id,
            program_id=r.program_id,
            structure_hash=r.structure_hash,
            structure=loads(r.structure_json),
            verification=loads(r.verification_json),
            num_kernels=r.num_kernels,
            bytes_moved=r.bytes_moved,
            created_at=utc(r.created_at),
        )
        for r in rows
    ]


def fetch_measurements(conn: Connection, trial_id: int) -> list[MeasurementRecord]:
    rows = conn.execute(
        select(MeasurementRow)
        .where(MeasurementRow.trial_id == trial_id)
        .order_by(MeasurementRow.device_key, MeasurementRow.attempt)
    ).all()
    return [
        MeasurementRecord(
            id=r.id,
            trial_id=r.trial_id,
            device_key=r.device_key,
            attempt=r.attempt,
            status=r.status,
            median_s=r.median_s,
            spread_s=r.spread_s,
            samples=loads(r.samples_json),
            max_error=r.max_error,
            message=r.message,
            host=r.host,
            measured_at=utc(r.measured_at),
        )
        for r in rows
    ]


def fetch_history(
    conn: Connection,
    program_hash: str,
    shapes: Any = None,
    dtype: str | None = None,
    device_key: str | None = None,
    status: str | None = None,
    limit: int | None = None,
) -> list[HistoryEntry]:
    stmt = (
        select(
            MeasurementRow.__table__,
            StructureRow.id.label("structure_id"),
            StructureRow.structure_hash,
            ProgramRow.shapes_key,
            ProgramRow.dtype,
            TrialRow.config_json,
            TrialRow.study_name,
            TrialRow.trial_number,
        )
        .join(TrialRow, TrialRow.id == MeasurementRow.trial_id)
        .join(StructureRow, StructureRow.id == TrialRow.structure_id)
        .join(ProgramRow, ProgramRow.id == StructureRow.program_id)
        .where(ProgramRow.program_hash == program_hash)
        .order_by(MeasurementRow.measured_at, MeasurementRow.id)
    )
    if shapes is not None:
        stmt = stmt.where(ProgramRow.shapes_key == shapes_key(shapes))
    if dtype is not None:
        stmt = stmt.where(ProgramRow.dtype == dtype)
    if device_key is not None:
        stmt = stmt.where(MeasurementRow.device_key == device_key)
    if status is not None:
        stmt = stmt.where(MeasurementRow.status == status)
    if limit is not None:
        stmt = stmt.limit(limit)
    out = []
    for row in conn.execute(stmt):
        m = row
        out.append(
            HistoryEntry(
                measurement_id=m.id,
                trial_id=m.trial_id,
                structure_id=row.structure_id,
                structure_hash=row.structure_hash,
                shapes_key=row.shapes_key,
                dtype=row.dtype,
                device_key=m.device_key,
                config=loads(row.config_json),
                study_name=row.study_name,
                trial_number=row.trial_number,
                attempt=m.attempt,
                status=m.status,
                median_s=m.median_s,
                spread_s=m.spread_s,
                max_error=m.max_error,
                message=m.message,
                host=m.host,
                measured_at=utc(m.measured_at),
            )
        )
    return out


def count_rows(conn: Connection) -> dict[str, int]:
    """Rows per tuner table (used by the summary and by duplicate-row checks)."""
    tables = (ProgramRow, JobRow, SearchShardRow, StructureRow, TrialRow, MeasurementRow,
              BestKernelRow)
    return {
        t.__tablename__: conn.execute(select(func.count()).select_from(t)).scalar_one()
        for t in tables
    }


class Reads:
    """The read methods of ``Database`` (kept here, next to their queries)."""

    engine: Engine
    _lookup: Engine  # the same pool, for single-statement reads (see db._engine)

    def program_id(self, program_hash: str, shapes: Any, dtype: str) -> int | None:
        with self._lookup.connect() as conn:
            return fetch_program_id(conn, program_hash, shapes, dtype)

    def shard_done(self, job_id: int, shard_key: str) -> bool:
        with self._lookup.connect() as conn:
            status = conn.execute(
                select(SearchShardRow.status).where(
                    SearchShardRow.job_id == job_id, SearchShardRow.shard_key == shard_key
                )
            ).scalar_one_or_none()
        return status == "finished"

    def finished_shards(self, job_id: int) -> set[str]:
        with self._lookup.connect() as conn:
            rows = conn.execute(
                select(SearchShardRow.shard_key).where(
                    SearchShardRow.job_id == job_id, SearchShardRow.status == "finished"
                )
            )
            return set(rows.scalars())

    def job(self, job_key: str) -> JobRecord | None:
        """The job registered under ``job_key`` (None: never launched against this database)."""
        with self._lookup.connect() as conn:
            row = conn.execute(select(JobRow.__table__).where(JobRow.job_key == job_key)).first()
        if row is None:
            return None
        return JobRecord(id=row.id, job_key=row.job_key, job_path=row.job_path,
                         status=row.status, attempts=row.attempts,
                         started_at=utc(row.started_at), finished_at=utc(row.finished_at),
                         timings=loads(row.timings_json), resumed=row.attempts > 1)

    def jobs(self) -> list[JobRecord]:
        """Every job launched against this database, the most recently started first."""
        with self._lookup.connect() as conn:
            rows = conn.execute(select(JobRow.__table__).order_by(JobRow.started_at.desc(),
                                                               JobRow.id.desc())).all()
        return [JobRecord(id=r.id, job_key=r.job_key, job_path=r.job_path, status=r.status,
                          attempts=r.attempts, started_at=utc(r.started_at),
                          finished_at=utc(r.finished_at), timings=loads(r.timings_json),
                          resumed=r.attempts > 1) for r in rows]

    def programs(self) -> list[ProgramSummary]:
        """Per program × shapes × dtype: structures, configs and timings stored, in order of
        the program's first record."""
        structures = (select(StructureRow.program_id, func.count().label("n"))
                      .group_by(StructureRow.program_id).subquery())
        measured = (select(StructureRow.program_id,
                           func.count(func.distinct(TrialRow.id)).label("configs"),
                           func.count(MeasurementRow.id).label("timings"),
                           func.sum(case((MeasurementRow.status != OK, 1), else_=0))
                           .label("failed"),
                           func.max(MeasurementRow.measured_at).label("last"))
                    .join(TrialRow, TrialRow.structure_id == StructureRow.id)
                    .join(MeasurementRow, MeasurementRow.trial_id == TrialRow.id)
                    .group_by(StructureRow.program_id).subquery())
        stmt = (select(ProgramRow.id, ProgramRow.name, ProgramRow.program_hash,
                       ProgramRow.shapes_key, ProgramRow.dtype, structures.c.n,
                       measured.c.configs, measured.c.timings, measured.c.failed,
                       measured.c.last)
                .outerjoin(structures, structures.c.program_id == ProgramRow.id)
                .outerjoin(measured, measured.c.program_id == ProgramRow.id)
                .order_by(ProgramRow.id))
        with self._lookup.connect() as conn:
            rows = conn.execute(stmt).all()
        return [ProgramSummary(r[0], r[1], r[2], r[3], r[4], int(r[5] or 0), int(r[6] or 0),
                               int(r[7] or 0), int(r[8] or 0), utc(r[9])) for r in rows]

    def program_graphs(self, name: str) -> list[tuple[Any, str, Any]]:
        """(shapes, dtype, reference graph) of every program stored under ``name``, oldest
        first: what a program known only by its name in the database (a PyTorch region's
        ``torch_<hash>``) is rebuilt from."""
        with self._lookup.connect() as conn:
            rows = conn.execute(select(ProgramRow.shapes_key, ProgramRow.dtype,
                                       ProgramRow.graph_json)
                                .where(ProgramRow.name == name).order_by(ProgramRow.id)).all()
        return [(loads(shapes), dtype, loads(graph)) for shapes, dtype, graph in rows]

    def shard_results(self, job_id: int, prefix: str = "") -> dict[str, Any]:
        """Stats of the job's finished shards whose key starts with ``prefix``, by key."""
        with self._lookup.connect() as conn:
            rows = conn.execute(
                select(SearchShardRow.shard_key, SearchShardRow.stats_json).where(
                    SearchShardRow.job_id == job_id,
                    SearchShardRow.status == "finished",
                    SearchShardRow.shard_key.startswith(prefix, autoescape=True),
                )
            )
            return {key: loads(stats) for key, stats in rows}

    def best_kernel(
        self, program_hash: str, shapes: Any, dtype: str, device_key: str | None = None
    ) -> BestKernel | None:
        """The best kernel on ``device_key``; with None, the fastest over all devices."""
        with self._lookup.connect() as conn:
            return fetch_best_kernel(conn, program_hash, shapes, dtype, device_key)

    def best_kernels(self, program_hash: str, shapes: Any, dtype: str) -> list[BestKernel]:
        """The best kernel of every device key, fastest first."""
        with self._lookup.connect() as conn:
            return fetch_best_kernels(conn, program_hash, shapes, dtype)

    def structures(self, program_id: int) -> list[StructureRecord]:
        with self._lookup.connect() as conn:
            return fetch_structures(conn, program_id)

    def measurements(self, trial_id: int) -> list[MeasurementRecord]:
        with self._lookup.connect() as conn:
            return fetch_measurements(conn, trial_id)

    def history(
        self,
        program_hash: str,
        shapes: Any = None,
        dtype: str | None = None,
        device_key: str | None = None,
        status: str | None = None,
        limit: int | None = None,
    ) -> list[HistoryEntry]:
        """Every measurement of a program (optionally narrowed), oldest first."""
        with self._lookup.connect() as conn:
            return fetch_history(conn, program_hash, shapes, dtype, device_key, status, limit)

    def row_counts(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            return count_rows(conn)
