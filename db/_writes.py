"""The write side of ``Database``: sessions and the idempotent writes.

Every write helper is one transaction and is idempotent: it inserts with ON CONFLICT DO NOTHING
(or a guarded DO UPDATE) on the table's natural key and then returns the id of the row that
holds that key, whether this call or an earlier, retried one wrote it. A task killed between two
helpers therefore leaves a consistent prefix that a resumed job simply completes.
"""

from __future__ import annotations

import math
import socket
import statistics
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from db._models import (
    DTYPE_LEN,
    HASH_LEN,
    JOB_STATUSES,
    KEY_LEN,
    MEASUREMENT_STATUSES,
    SHARD_STATUSES,
    BestKernelRow,
    JobRow,
    MeasurementRow,
    ProgramRow,
    SearchShardRow,
    StructureRow,
    TrialRow,
    utcnow,
)
from db._records import (
    JobRecord,
    check_choice,
    check_key,
    check_time,
    config_hash,
    json_text,
    loads,
    shapes_key,
    utc,
)
from kernels import OK

MAX_MESSAGE = 65_536  # characters of an error message kept (compiler logs can be huge)


class Writes:
    """The write methods of ``Database`` (kept here, next to their helpers), and the sessions
    they run in."""

    _insert: Any  # the dialect's INSERT, which has ON CONFLICT (sqlite's or PostgreSQL's)
    _writer: sessionmaker[Session]  # sessions on the engine writes go through (db._engine)
    _reader: sessionmaker[Session]

    @contextmanager
    def session(self, write: bool = True) -> Iterator[Session]:
        """An ORM session that commits on success and rolls everything back on any exception."""
        with (self._writer if write else self._reader)() as s, s.begin():
            yield s

    def _insert_id(
        self, s: Session, model: type, values: dict[str, Any], keys: Sequence[str]
    ) -> tuple[int, bool]:
        """Insert unless the key exists; the row's id and whether this call inserted it."""
        stmt = (
            self._insert(model)
            .values(**values)
            .on_conflict_do_nothing(index_elements=list(keys))
            .returning(model.id)  # type: ignore[attr-defined]
        )
        new_id = _execute(s, stmt, model).scalar_one_or_none()
        if new_id is not None:
            return new_id, True
        where = [getattr(model, k) == values[k] for k in keys]
        return s.execute(select(model.id).where(*where)).scalar_one(), False  # type: ignore[attr-defined]

    def record_program(
        self, program_hash: str, shapes: Any, dtype: str, name: str, graph: Any
    ) -> int:
        """Id of the program row for (hash, shapes, dtype); the first write's name/graph stay."""
        values = {
            "program_hash": check_key(program_hash, "program_hash", HASH_LEN),
            "shapes_key": shapes_key(shapes),
            "dtype": check_key(dtype, "dtype", DTYPE_LEN),
            "name": check_key(name, "name", KEY_LEN),
            "graph_json": json_text(graph, "graph"),
            "created_at": utcnow(),
        }
        with self.session() as s:
            keys = ("program_hash", "shapes_key", "dtype")
            return self._insert_id(s, ProgramRow, values, keys)[0]

    def start_job(self, job_key: str, job_path: str) -> JobRecord:
        """Register a job run; the same ``job_key`` again resumes that job (``resumed=True``)."""
        values: dict[str, Any] = {
            "job_key": check_key(job_key, "job_key", KEY_LEN),
            "job_path": str(job_path),
            "status": "running",
            "attempts": 1,
            "started_at": utcnow(),
        }
        with self.session() as s:
            job_id, inserted = self._insert_id(s, JobRow, values, ("job_key",))
            job = s.get_one(JobRow, job_id)
            if not inserted:
                job.status, job.finished_at, job.job_path = "running", None, values["job_path"]
                job.attempts += 1
            s.flush()
            return _job_record(job, resumed=not inserted)

    def finish_job(
        self, job_id: int, status: str = "finished", timings: dict[str, Any] | None = None
    ) -> JobRecord:
        """Close a job run as finished, failed or interrupted, with its phase timings."""
        check_choice(status, "job status", JOB_STATUSES[1:])
        with self.session() as s:
            job = s.get(JobRow, job_id)
            if job is None:
                raise ValueError(f"no job with id {job_id} in {self!r}")
            job.status, job.finished_at = status, utcnow()
            if timings is not None:
                job.timings_json = json_text(timings, "timings")
            s.flush()
            return _job_record(job, resumed=job.attempts > 1)

    def record_shard(
        self, job_id: int, shard_key: str, status: str = "finished", stats: Any = None
    ) -> None:
        """Record a search shard's progress; once finished, a shard stays finished."""
        check_choice(status, "shard status", SHARD_STATUSES)
        values = {
            "job_id": job_id,
            "shard_key": check_key(shard_key, "shard_key", KEY_LEN),
            "status": status,
            "stats_json": None if stats is None else json_text(stats, "stats"),
            "updated_at": utcnow(),
        }
        stmt = self._insert(SearchShardRow).values(**values)
        stmt = stmt.on_conflict_do_update(
            index_elements=["job_id", "shard_key"],
            set_={k: stmt.excluded[k] for k in ("status", "stats_json", "updated_at")},
            where=SearchShardRow.status != "finished",
        )
        with self.session() as s:
            _execute(s, stmt, SearchShardRow)

    def record_structure(
        self,
        program_id: int,
        structure_hash: str,
        structure: Any,
        verification: Any,
        num_kernels: int,
        bytes_moved: int | None = None,
    ) -> int:
        """Id of the structure row for (program, hash). Store only verified structures."""
        if not isinstance(num_kernels, int) or num_kernels < 0:
            raise ValueError(f"num_kernels must be an int >= 0, got {num_kernels!r}")
        if bytes_moved is not None and (not isinstance(bytes_moved, int) or bytes_moved < 0):
            raise ValueError(f"bytes_moved must be an int >= 0 or None, got {bytes_moved!r}")
        values = {
            "program_id": program_id,
            "structure_hash": check_key(structure_hash, "structure_hash", HASH_LEN),
            "structure_json": json_text(structure, "structure"),
            "verification_json": json_text(verification, "verification"),
            "num_kernels": num_kernels,
            "bytes_moved": bytes_moved,
            "created_at": utcnow(),
        }
        with self.session() as s:
            return self._insert_id(s, StructureRow, values, ("program_id", "structure_hash"))[0]

    def record_trial(
        self,
        structure_id: int,
        device_key: str,
        config: Any,
        study_name: str | None = None,
        trial_number: int | None = None,
    ) -> int:
        """Id of the trial row for (structure, device, config); the config hash is ours."""
        values = {
            "structure_id": structure_id,
            "device_key": check_key(device_key, "device_key", KEY_LEN),
            "config_hash": config_hash(config),
            "config_json": json_text(config, "config"),
            "study_name": study_name,
            "trial_number": trial_number,
            "created_at": utcnow(),
        }
        with self.session() as s:
            keys = ("structure_id", "device_key", "config_hash")
            return self._insert_id(s, TrialRow, values, keys)[0]

    def record_measurement(
        self,
        trial_id: int,
        status: str,
        *,
        median_s: float | None = None,
        spread_s: float | None = None,
        samples: Sequence[float] | None = None,
        max_error: float | None = None,
        message: str | None = None,
        host: str | None = None,
        attempt: int = 0,
        device_key: str | None = None,
    ) -> int:
        """Id of the measurement (trial, device, attempt); a retried write returns the first.

        ``device_key`` defaults to the trial's and must equal it: timings never mix devices.
        A NaN ``max_error`` (output had NaNs) is stored as +inf, which every backend keeps.
        """
        check_choice(status, "measurement status", MEASUREMENT_STATUSES)
        median = check_time(median_s, "median_s")
        if status == OK and not median:
            raise ValueError("a measurement with status 'ok' needs median_s > 0")
        if not isinstance(attempt, int) or attempt < 0:
            raise ValueError(f"attempt must be an int >= 0, got {attempt!r}")
        sample_list = None
        if samples is not None:
            sample_list = [check_time(x, "samples[]") for x in samples]
        if max_error is not None:
            max_error = math.inf if math.isnan(float(max_error)) else float(max_error)
        with self.session() as s:
            trial_device = s.execute(
                select(TrialRow.device_key).where(TrialRow.id == trial_id)
            ).scalar_one_or_none()
            if trial_device is None:
                raise ValueError(f"no trial with id {trial_id}: record the trial first")
            if device_key is not None and device_key != trial_device:
                raise ValueError(
                    f"device_key {device_key!r} differs from trial {trial_id}'s device"
                    f" {trial_device!r}: record a trial for that device"
                )
            values = {
                "trial_id": trial_id,
                "device_key": trial_device,
                "attempt": attempt,
                "status": status,
                "median_s": median,
                "spread_s": check_time(spread_s, "spread_s"),
                "samples_json": None if sample_list is None else json_text(sample_list, "samples"),
                "max_error": max_error,
                "message": None if message is None else str(message)[:MAX_MESSAGE],
                "host": check_key(host or socket.gethostname(), "host", KEY_LEN),
                "measured_at": utcnow(),
            }
            keys = ("trial_id", "device_key", "attempt")
            return self._insert_id(s, MeasurementRow, values, keys)[0]

    def update_best(
        self, measurement_id: int, source: str, baseline_s: float | None = None,
        uncertain: str | None = None,
    ) -> bool:
        """Make this measurement's kernel the best of its program × shapes × dtype × device.

        Keys, structure, trial and time all come from the measurement itself, so the best row
        cannot disagree with what was measured. Only an 'ok' measurement strictly faster than
        the stored best replaces it (one atomic upsert); returns whether the row changed.
        ``uncertain``: why this timing may not be trusted (stored with the best, shown by
        every reader of it), None when it can.
        """
        baseline = _best_args(source, baseline_s)
        with self.session() as s:
            row = s.execute(
                _with_keys().where(MeasurementRow.id == measurement_id)
            ).first()
            if row is None:
                raise ValueError(f"no measurement with id {measurement_id}")
            m, program = row.MeasurementRow, row.ProgramRow
            if m.status != OK:
                return False
            values = _best_row(m, row.structure_id, program, source, m.median_s, baseline,
                               uncertain)
            return self._upsert_best(s, values, only_faster=True)

    def confirm_best(
        self, trial_id: int, source: str, baseline_s: float | None = None,
        uncertain: str | None = None, time_s: float | None = None,
    ) -> float | None:
        """Make this trial's kernel the best of its program × shapes × dtype × device at its
        confirmed time: the median of all its 'ok' measurements (first timing and deliberate
        re-measurements alike).  Unlike ``update_best`` this may make the stored best slower:
        it is how a lucky first timing is corrected.  A trial with any failed measurement is
        not confirmed (returns None, nothing written); else returns the confirmed time.
        ``time_s``: the confirmed time when the caller judged it (the median of interleaved
        rounds); ``uncertain``: why the choice may be wrong, None when the timings made it."""
        baseline = _best_args(source, baseline_s)
        with self.session() as s:
            rows = s.execute(
                _with_keys().where(MeasurementRow.trial_id == trial_id)
                .order_by(MeasurementRow.attempt)
            ).all()
            if not rows:
                raise ValueError(f"no measurements of trial {trial_id}")
            if any(r.MeasurementRow.status != OK for r in rows):
                return None
            confirmed = check_time(time_s, "time_s") or statistics.median(
                r.MeasurementRow.median_s for r in rows)
            last, program = rows[-1].MeasurementRow, rows[-1].ProgramRow
            values = _best_row(last, rows[-1].structure_id, program, source, confirmed,
                               baseline, uncertain)
            self._upsert_best(s, values, only_faster=False)
            return confirmed

    def _upsert_best(self, s: Session, values: dict, only_faster: bool) -> bool:
        """Insert or replace the best row of ``values``' key (atomically); with
        ``only_faster`` only a strictly faster time replaces.  Returns whether it changed."""
        insert = self._insert(BestKernelRow).values(**values)
        new = insert.excluded
        upsert = insert.on_conflict_do_update(
            index_elements=["program_hash", "shapes_key", "dtype", "device_key"],
            set_={
                "structure_id": new.structure_id,
                "trial_id": new.trial_id,
                "measurement_id": new.measurement_id,
                "source": new.source,
                "time_s": new.time_s,
                "baseline_s": func.coalesce(new.baseline_s, BestKernelRow.baseline_s),
                "updated_at": new.updated_at,
                "uncertain": new.uncertain,
            },
            where=(BestKernelRow.time_s > new.time_s) if only_faster else None,
        ).returning(BestKernelRow.id)
        return s.execute(upsert).scalar_one_or_none() is not None


def _with_keys() -> Any:
    """Measurements with the trial's structure and the program they were of."""
    return (
        select(MeasurementRow, TrialRow.structure_id, ProgramRow)
        .join(TrialRow, TrialRow.id == MeasurementRow.trial_id)
        .join(StructureRow, StructureRow.id == TrialRow.structure_id)
        .join(ProgramRow, ProgramRow.id == StructureRow.program_id)
    )


def _best_args(source: Any, baseline_s: float | None) -> float | None:
    if not isinstance(source, str) or not source.strip():
        raise ValueError("source must be the kernel's non-empty source text")
    return check_time(baseline_s, "baseline_s")


def _best_row(m: MeasurementRow, structure_id: int, program: ProgramRow, source: str,
              time_s: float, baseline_s: float | None, uncertain: str | None = None) -> dict:
    """A best-kernel row: keys from the measurement's program, trial and device."""
    return dict(
        program_hash=program.program_hash,
        shapes_key=program.shapes_key,
        dtype=program.dtype,
        device_key=m.device_key,
        structure_id=structure_id,
        trial_id=m.trial_id,
        measurement_id=m.id,
        source=source,
        time_s=time_s,
        baseline_s=baseline_s,
        updated_at=utcnow(),
        uncertain=uncertain,
    )


def _execute(s: Session, stmt: Any, model: type) -> Any:
    """Run a write; a foreign-key failure names the table and the likely cause."""
    try:
        return s.execute(stmt)
    except IntegrityError as exc:
        raise ValueError(
            f"cannot write {model.__tablename__}: {exc.orig}; check that the ids it refers to"  # type: ignore[attr-defined]
            " (program, job, structure, trial) exist in this database"
        ) from exc


def _job_record(job: JobRow, resumed: bool) -> JobRecord:
    return JobRecord(
        id=job.id,
        job_key=job.job_key,
        job_path=job.job_path,
        status=job.status,
        attempts=job.attempts,
        started_at=utc(job.started_at),
        finished_at=utc(job.finished_at),
        timings=loads(job.timings_json),
        resumed=resumed,
    )
