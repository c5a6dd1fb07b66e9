"""What the dashboard reads, as aggregated SQL on the tuner tables, through a read-only engine.

The dashboard never writes: on SQLite every connection sets ``PRAGMA query_only``, on
PostgreSQL every session is ``READ ONLY``, and no query here is anything but a SELECT.  The
tables are declared here by name and column (``sqlalchemy.table``), the schema being the
contract, so that this module depends on the migrations, not on ``db``'s internals.

Everything that grows with the number of measurements is aggregated in SQL (counts grouped by
program × device × status) or reduced there before it reaches Python: the best-so-far curve is
only the measurements that beat every earlier one (a window function), and the scatter is
thinned to at most ``SCATTER_POINTS`` rows by row number.
"""

from __future__ import annotations

import bisect
import json
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from optuna.storages._rdb.models import StudyModel, TrialModel
from optuna.trial import TrialState
from sqlalchemy import (
    Engine,
    and_,
    case,
    create_engine,
    event,
    func,
    literal,
    or_,
    select,
)
from sqlalchemy.exc import NoSuchTableError, OperationalError, ProgrammingError
from sqlalchemy.pool import StaticPool

import db

SCATTER_POINTS = 1500
SERIES_KEPT = 32  # program x device series kept up to date in memory (the most recently read)
WINDOW = 1000  # trailing measurement ids re-read on every refresh (see Reader._refresh_totals)
FAILURES_PAGE = 200

# db's own tables (the ORM rows' ``__table__``): the schema is declared once, in db/_models.py
programs_t = db.ProgramRow.__table__
jobs_t = db.JobRow.__table__
shards_t = db.SearchShardRow.__table__
structures_t = db.StructureRow.__table__
trials_t = db.TrialRow.__table__
meas_t = db.MeasurementRow.__table__
best_t = db.BestKernelRow.__table__
# Optuna's own tables (same database), as Optuna's storage declares them; read only for the
# trial states of our studies
studies_t = StudyModel.__table__
otrials_t = TrialModel.__table__

M, T, S, P = meas_t.c, trials_t.c, structures_t.c, programs_t.c


def utc(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):  # a backend that hands back text
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else \
        value.astimezone(timezone.utc)


def shown_url(url: Any) -> str:
    """The database URL with its password masked: the only form a page or a log shows."""
    return db.normalize_url(url).render_as_string(hide_password=True)


def read_only_engine(url: Any) -> Engine:
    """An engine that cannot write, for the database at ``url`` (which must exist and be at
    the schema head: ``db.connect(..., migrate_schema=False)`` says what to run otherwise)."""
    parsed = db.normalize_url(url)
    db.connect(parsed, migrate_schema=False).close()  # SchemaError / missing file, in words
    if parsed.get_backend_name() == "sqlite":
        memory = parsed.database in (None, "", ":memory:")
        engine = create_engine(parsed, connect_args={"check_same_thread": False},
                               **({"poolclass": StaticPool} if memory else {}))

        @event.listens_for(engine, "connect")
        def _sqlite(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
            cur = dbapi_connection.cursor()
            cur.execute(f"PRAGMA busy_timeout={30000}")
            cur.execute("PRAGMA query_only=ON")
            cur.close()
    else:
        engine = create_engine(parsed, pool_pre_ping=True)

        @event.listens_for(engine, "connect")
        def _pg(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
            cur = dbapi_connection.cursor()
            cur.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
            cur.close()
            dbapi_connection.commit()
    return engine


# ------------------------------------------------------------------------------- records


@dataclass
class DeviceProgress:
    """One program on one device key: what the tuning of it has measured so far."""

    device_key: str
    trials: int = 0  # configs measured (attempt 0)
    timings: int = 0  # every measurement, the confirmation's re-timings included
    statuses: dict[str, int] = field(default_factory=dict)  # attempt-0 measurements by status
    failed: int = 0
    first_at: datetime | None = None
    last_at: datetime | None = None
    best_first_s: float | None = None  # the fastest single first timing
    best: dict | None = None  # the confirmed best kernel row
    optuna: dict[str, int] = field(default_factory=dict)  # Optuna trial states of its studies

    @property
    def skipped(self) -> int:
        return self.optuna.get("PRUNED", 0)

    def as_dict(self) -> dict:
        best = self.best
        return {"device_key": self.device_key, "trials": self.trials, "timings": self.timings,
                "statuses": self.statuses, "failed": self.failed,
                "failed_trials": self.trials - self.statuses.get("ok", 0),
                "failed_text": ", ".join(f"{k} {v}" for k, v in sorted(self.statuses.items())
                                         if k != "ok" and v), "skipped": self.skipped,
                "optuna": self.optuna, "first_at": iso(self.first_at),
                "last_at": iso(self.last_at), "best_first_s": self.best_first_s,
                "best": None if best is None else {
                    k: (iso(v) if isinstance(v, datetime) else v) for k, v in best.items()}}


@dataclass
class ProgramRow:
    id: int
    name: str
    program_hash: str
    shapes: dict
    dtype: str
    structures: int = 0
    verified: int = 0  # structures the search verified (the program as written excluded)
    search_states: int | None = None
    search_shards: int = 0
    devices: dict[str, DeviceProgress] = field(default_factory=dict)
    created_at: datetime | None = None  # a launch records a program as it reaches it

    @property
    def shapes_text(self) -> str:
        return shapes_text(self.shapes)

    @property
    def trials(self) -> int:
        return sum(d.trials for d in self.devices.values())

    def as_dict(self) -> dict:
        return {"id": self.id, "name": self.name, "program_hash": self.program_hash,
                "shapes": self.shapes, "shapes_text": self.shapes_text, "dtype": self.dtype,
                "structures": self.structures, "verified": self.verified,
                "search_states": self.search_states, "search_shards": self.search_shards,
                "devices": [d.as_dict() for d in self.devices.values()]}


def iso(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat()


def shapes_text(shapes: Any) -> str:
    if isinstance(shapes, dict):
        return " ".join(f"{k}={'x'.join(map(str, v))}" for k, v in shapes.items())
    return json.dumps(shapes)


def loads(value: str | None) -> Any:
    return None if value is None else json.loads(value)


# ------------------------------------------------------------------------------- reader


class Reader:
    """The dashboard's queries over one read-only engine (thread-safe; one per app)."""

    def __init__(self, url: Any, engine: Engine | None = None) -> None:
        self.url = shown_url(url)
        self.engine = engine or read_only_engine(url)
        self._shard_stats: dict[int, tuple[int, int]] = {}  # shard id -> (states, verified)
        self._lock = threading.Lock()
        # per (program id, device key, status): [timings, first timings, first measured_at,
        # last measured_at, fastest ok first timing], kept up to date incrementally
        self._totals: dict[tuple[int, str, str], list] = {}
        self._low: int | None = None  # every measurement with id <= this is counted
        self._seen: set[int] = set()  # ids > _low already counted
        self._totals_lock = threading.Lock()
        self._optuna_inc: dict | None = None  # see _refresh_optuna
        self._series: dict[tuple, dict] = {}  # (program, device, timings there) -> series
        self._series_state: dict[tuple[int, str], _Series] = {}
        self._series_lock = threading.Lock()

    def close(self) -> None:
        self.engine.dispose()

    # -- jobs -----------------------------------------------------------------------------

    def jobs(self) -> list[dict]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(jobs_t).order_by(jobs_t.c.started_at.desc(),
                                                        jobs_t.c.id.desc())).all()
        return [self._job(r) for r in rows]

    def job(self, job_id: int) -> dict | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(jobs_t).where(jobs_t.c.id == job_id)).first()
        return None if row is None else self._job(row)

    @staticmethod
    def _job(r: Any) -> dict:
        return {"id": r.id, "job_key": r.job_key, "job_path": r.job_path, "status": r.status,
                "attempts": r.attempts, "started_at": utc(r.started_at),
                "finished_at": utc(r.finished_at), "timings": loads(r.timings_json)}

    def job_program_hashes(self, job_ids: list[int] | None = None) -> dict[int, list[str]]:
        """The program-hash prefixes each job searched, from its shard keys (``HASH16/...``),
        in the order the job reached them."""
        stmt = select(shards_t.c.job_id, shards_t.c.shard_key).order_by(shards_t.c.id)
        if job_ids is not None:
            stmt = stmt.where(shards_t.c.job_id.in_(job_ids))
        out: dict[int, list[str]] = {}
        with self.engine.connect() as conn:
            for job_id, key in conn.execute(stmt):
                prefix = key.split("/", 1)[0]
                seen = out.setdefault(job_id, [])
                if prefix not in seen:
                    seen.append(prefix)
        return out

    def search_stats(self, job_id: int) -> dict[str, tuple[int, int]]:
        """Per program-hash prefix: (search states explored, shards) of the job's finished
        shards.  A shard's stats never change once finished, so each is parsed once."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(shards_t.c.id, shards_t.c.shard_key).where(
                shards_t.c.job_id == job_id, shards_t.c.status == "finished")).all()
            missing = [r.id for r in rows if r.id not in self._shard_stats]
            for i in range(0, len(missing), 500):
                for sid, stats in conn.execute(select(shards_t.c.id, shards_t.c.stats_json)
                                               .where(shards_t.c.id.in_(missing[i:i + 500]))):
                    obj = loads(stats) or {}
                    states = int((obj.get("stats") or {}).get("states", 0))
                    with self._lock:
                        self._shard_stats[sid] = (states, len(obj.get("verified") or {}))
        out: dict[str, tuple[int, int]] = {}
        for r in rows:
            prefix = r.shard_key.split("/", 1)[0]
            states, n = out.get(prefix, (0, 0))
            out[prefix] = (states + self._shard_stats.get(r.id, (0, 0))[0], n + 1)
        return out

    # -- programs -------------------------------------------------------------------------

    def programs(self, ids: list[int] | None = None, hashes: list[str] | None = None,
                 optuna: bool = True) -> list[ProgramRow]:
        """Programs (all, by id, or by program-hash prefix) with their per-device progress,
        in four grouped queries whatever the number of measurements."""
        stmt = select(P.id, P.name, P.program_hash, P.shapes_key, P.dtype,
                      P.created_at).order_by(P.id)
        if ids is not None:
            stmt = stmt.where(P.id.in_(ids))
        if hashes is not None:
            if not hashes:
                return []
            stmt = stmt.where(or_(*[P.program_hash.startswith(h, autoescape=True)
                                    for h in hashes]))
        with self.engine.connect() as conn:
            progs = {r.id: ProgramRow(r.id, r.name, r.program_hash, loads(r.shapes_key),
                                      r.dtype, created_at=utc(r.created_at))
                     for r in conn.execute(stmt)}
            if not progs:
                return []
            pids = list(progs)
            for pid, n, ref in conn.execute(
                    select(S.program_id, func.count(),
                           func.sum(case((S.verification_json.like('%"verdict":"reference"%'),
                                          1), else_=0)))
                    .where(S.program_id.in_(pids)).group_by(S.program_id)):
                progs[pid].structures, progs[pid].verified = int(n), int(n) - int(ref or 0)
            totals = self._refresh_totals(conn)
            for (pid, dev, status), (n, firsts, first, last, fastest) in totals.items():
                if pid not in progs:
                    continue
                d = progs[pid].devices.setdefault(dev, DeviceProgress(dev))
                d.timings += n
                d.trials += firsts
                if firsts:
                    d.statuses[status] = d.statuses.get(status, 0) + firsts
                if status != "ok":
                    d.failed += n
                d.first_at = first if d.first_at is None else min(d.first_at, first)
                d.last_at = last if d.last_at is None else max(d.last_at, last)
                if status == "ok" and fastest is not None:
                    d.best_first_s = fastest
            by_key = {(p.program_hash, json.dumps(p.shapes, sort_keys=True,
                                                  separators=(",", ":")), p.dtype): p
                      for p in progs.values()}
            best = (select(best_t.c.program_hash, best_t.c.shapes_key, best_t.c.dtype,
                           best_t.c.device_key, best_t.c.trial_id, best_t.c.structure_id,
                           best_t.c.time_s, best_t.c.baseline_s, best_t.c.updated_at,
                           S.structure_hash, T.config_json)
                    .select_from(best_t.join(structures_t, S.id == best_t.c.structure_id)
                                 .join(trials_t, T.id == best_t.c.trial_id))
                    .where(best_t.c.program_hash.in_({p.program_hash for p in progs.values()})))
            for r in conn.execute(best):
                p = by_key.get((r.program_hash, r.shapes_key, r.dtype))
                if p is None:
                    continue
                d = p.devices.setdefault(r.device_key, DeviceProgress(r.device_key))
                d.best = {"trial_id": r.trial_id, "structure_id": r.structure_id,
                          "structure_hash": r.structure_hash, "config": loads(r.config_json),
                          "time_s": r.time_s, "baseline_s": r.baseline_s,
                          "speedup": (r.baseline_s / r.time_s) if r.baseline_s else None,
                          "updated_at": utc(r.updated_at)}
            if optuna:
                self._optuna_states(conn, pids, progs)
        return list(progs.values())

    def _refresh_totals(self, conn: Any) -> dict[tuple[int, str, str], list]:
        """The per program × device × status totals of every measurement, brought up to date
        by reading only the measurements not counted yet.  Measurements are only ever
        inserted (never updated or deleted), so totals only grow; the first call aggregates
        everything in SQL, later ones read the rows above a low-water mark.  The last
        ``WINDOW`` ids are re-read on every call, because on PostgreSQL a transaction may
        commit a smaller id after a larger one was seen; ids counted are remembered there."""
        join = (meas_t.join(trials_t, T.id == M.trial_id)
                .join(structures_t, S.id == T.structure_id))
        with self._totals_lock:
            if self._low is None:
                top = conn.execute(select(func.max(M.id))).scalar() or 0
                low = max(0, top - WINDOW)
                agg = (select(S.program_id, M.device_key, M.status, func.count(),
                              func.sum(case((M.attempt == 0, 1), else_=0)),
                              func.min(M.measured_at), func.max(M.measured_at),
                              func.min(case((M.attempt == 0, M.median_s), else_=None)))
                       .select_from(join).where(M.id <= low)
                       .group_by(S.program_id, M.device_key, M.status))
                for pid, dev, status, n, firsts, first, last, fastest in conn.execute(agg):
                    self._totals[(pid, dev, status)] = [int(n), int(firsts or 0), utc(first),
                                                        utc(last), fastest]
                self._low = low
            rows = conn.execute(
                select(M.id, S.program_id, M.device_key, M.status, M.attempt,
                       M.measured_at, M.median_s).select_from(join)
                .where(M.id > self._low).order_by(M.id)).all()
            top = self._low
            for mid, pid, dev, status, attempt, at, median in rows:
                top = max(top, mid)
                if mid in self._seen:
                    continue
                self._seen.add(mid)
                at = utc(at)
                t = self._totals.get((pid, dev, status))
                if t is None:
                    self._totals[(pid, dev, status)] = t = [0, 0, at, at, None]
                t[0] += 1
                t[2], t[3] = min(t[2], at), max(t[3], at)
                if attempt == 0:
                    t[1] += 1
                    if status == "ok" and median is not None:
                        t[4] = median if t[4] is None else min(t[4], median)
            if top - WINDOW > self._low:
                self._low = top - WINDOW
                self._seen = {i for i in self._seen if i > self._low}
            return {k: list(v) for k, v in self._totals.items()}

    def _optuna_states(self, conn: Any, pids: list[int], progs: dict[int, ProgramRow]) -> None:
        """Optuna's trial states (COMPLETE / PRUNED = skipped by the roofline / FAIL) of the
        studies of each program × device; nothing when Optuna's tables are not there."""
        try:
            with conn.begin_nested() if conn.dialect.name == "postgresql" else _null():
                states = self._refresh_optuna(conn)
        except (OperationalError, ProgrammingError, NoSuchTableError):
            return
        for (pid, dev), counts in states.items():
            if pid in progs:
                d = progs[pid].devices.setdefault(dev, DeviceProgress(dev))
                for state, n in counts.items():
                    d.optuna[state] = d.optuna.get(state, 0) + n

    def _refresh_optuna(self, conn: Any) -> dict[tuple[int, str], dict[str, int]]:
        """Per (program, device): Optuna trials by state, kept up to date like the
        measurement totals.  Optuna's trials are appended, and change state only from
        RUNNING / WAITING to a final one: final ones are counted once, the unfinished ones
        remembered and looked at again on each refresh."""
        o = otrials_t.c
        with self._totals_lock:
            st = self._optuna_inc
            if st is None:
                st = {"low": None, "seen": set(), "pending": {}, "counts": {}, "study": {}}
            if st["low"] is None:
                top = conn.execute(select(func.max(o.trial_id))).scalar() or 0
                low = max(0, top - WINDOW)
                for sid, state, n in conn.execute(
                        select(o.study_id, o.state, func.count()).where(o.trial_id <= low)
                        .group_by(o.study_id, o.state)):
                    state = _state(state)
                    if state not in UNFINISHED:
                        c = st["counts"].setdefault(sid, {})
                        c[state] = c.get(state, 0) + int(n)
                for tid, sid in conn.execute(select(o.trial_id, o.study_id).where(
                        o.trial_id <= low,
                        o.state.in_([TrialState[n] for n in UNFINISHED]))):
                    st["pending"][tid] = sid
                st["low"] = low
            rows = conn.execute(select(o.trial_id, o.study_id, o.state)
                                .where(o.trial_id > st["low"]).order_by(o.trial_id)).all()
            pending = list(st["pending"])
            for i in range(0, len(pending), 500):
                rows += conn.execute(select(o.trial_id, o.study_id, o.state)
                                     .where(o.trial_id.in_(pending[i:i + 500]))).all()
            top = st["low"]
            for tid, sid, state in rows:
                state = _state(state)
                if tid > st["low"]:
                    top = max(top, tid)
                if tid in st["seen"] and tid not in st["pending"]:
                    continue
                st["seen"].add(tid)
                if state in UNFINISHED:
                    st["pending"][tid] = sid
                    continue
                st["pending"].pop(tid, None)
                c = st["counts"].setdefault(sid, {})
                c[state] = c.get(state, 0) + 1
            if top - WINDOW > st["low"]:
                st["low"] = top - WINDOW
                st["seen"] = {t for t in st["seen"] if t > st["low"]}
            self._optuna_inc = st
            # which program x device each study tunes: its name, in our trials (a study
            # is looked up once; one whose trials are not stored yet is tried again)
            unknown = [sid for sid in set(st["counts"]) | set(st["pending"].values())
                       if sid not in st["study"]]
            if unknown:
                names = dict(conn.execute(select(studies_t.c.study_id, studies_t.c.study_name)
                                          .where(studies_t.c.study_id.in_(unknown))).all())
                if names:
                    found = dict(((n, (pid, dev)) for n, pid, dev in conn.execute(
                        select(T.study_name, S.program_id, T.device_key).distinct()
                        .select_from(trials_t.join(structures_t, S.id == T.structure_id))
                        .where(T.study_name.in_(list(names.values()))))))
                    for sid, name in names.items():
                        if name in found:
                            st["study"][sid] = found[name]
            out: dict[tuple[int, str], dict[str, int]] = {}
            for sid, counts in st["counts"].items():
                key = st["study"].get(sid)
                if key is None:
                    continue
                agg = out.setdefault(key, {})
                for state, n in counts.items():
                    agg[state] = agg.get(state, 0) + n
            for sid in st["pending"].values():
                key = st["study"].get(sid)
                if key is not None:
                    agg = out.setdefault(key, {})
                    agg["RUNNING"] = agg.get("RUNNING", 0) + 1
            return out

    def program(self, program_id: int) -> dict | None:
        with self.engine.connect() as conn:
            r = conn.execute(select(programs_t).where(P.id == program_id)).first()
        if r is None:
            return None
        return {"id": r.id, "name": r.name, "program_hash": r.program_hash,
                "shapes": loads(r.shapes_key), "dtype": r.dtype, "graph": loads(r.graph_json),
                "created_at": utc(r.created_at)}

    # -- charts ---------------------------------------------------------------------------

    def series(self, program_id: int, device_key: str) -> dict:
        """The best-so-far curve (only the first timings that beat every earlier one, with
        their trial number and time) and a thinned scatter of every first timing, in the
        order the timings were stored.  The first call for a program × device reads its
        first timings once; later calls read only the new ones (as the totals do)."""
        with self.engine.connect() as conn:
            mine = {st: t for (pid, dev, st), t in self._refresh_totals(conn).items()
                    if pid == program_id and dev == device_key}
            version = (program_id, device_key, sum(t[0] for t in mine.values()))
            with self._series_lock:
                cached = self._series.get(version)
                if cached is not None:  # nothing was measured there since
                    return cached
                state = self._series_state.pop((program_id, device_key), None) or _Series()
                try:
                    state.refresh(conn, program_id, device_key)
                finally:
                    self._series_state[(program_id, device_key)] = state  # most recent last
                    while len(self._series_state) > SERIES_KEPT:
                        self._series_state.pop(next(iter(self._series_state)))
                out = state.as_dict()
                if len(self._series) > 256:
                    self._series.clear()
                self._series[version] = out
                return out

    # -- one kernel -----------------------------------------------------------------------

    def kernel(self, trial_id: int) -> dict | None:
        with self.engine.connect() as conn:
            r = conn.execute(
                select(T.id, T.device_key, T.config_json, T.study_name, T.trial_number,
                       S.id.label("structure_id"), S.structure_hash, S.structure_json,
                       S.verification_json, S.num_kernels, S.bytes_moved,
                       P.id.label("program_id"), P.name, P.shapes_key, P.dtype,
                       P.program_hash)
                .select_from(trials_t.join(structures_t, S.id == T.structure_id)
                             .join(programs_t, P.id == S.program_id))
                .where(T.id == trial_id)).first()
            if r is None:
                return None
            ms = conn.execute(select(meas_t).where(M.trial_id == trial_id)
                              .order_by(M.attempt, M.id)).all()
            b = conn.execute(select(best_t.c.source, best_t.c.time_s, best_t.c.baseline_s,
                                    best_t.c.updated_at, best_t.c.device_key)
                             .where(best_t.c.trial_id == trial_id)).first()
            study_id = None
            if r.study_name:
                try:
                    with conn.begin_nested() if conn.dialect.name == "postgresql" else _null():
                        study_id = conn.execute(select(studies_t.c.study_id).where(
                            studies_t.c.study_name == r.study_name)).scalar()
                except (OperationalError, ProgrammingError, NoSuchTableError):
                    study_id = None  # no Optuna tables in this database
        return {
            "trial_id": r.id, "device_key": r.device_key, "config": loads(r.config_json),
            "study_name": r.study_name, "trial_number": r.trial_number, "study_id": study_id,
            "structure_id": r.structure_id, "structure_hash": r.structure_hash,
            "structure": loads(r.structure_json), "verification": loads(r.verification_json),
            "num_kernels": r.num_kernels, "bytes_moved": r.bytes_moved,
            "program_id": r.program_id, "program": r.name, "shapes": loads(r.shapes_key),
            "dtype": r.dtype, "program_hash": r.program_hash,
            "measurements": [{"id": m.id, "attempt": m.attempt, "status": m.status,
                              "median_s": m.median_s, "spread_s": m.spread_s,
                              "samples": loads(m.samples_json), "max_error": m.max_error,
                              "message": m.message, "host": m.host,
                              "measured_at": utc(m.measured_at)} for m in ms],
            "best": None if b is None else {"source": b.source, "time_s": b.time_s,
                                            "baseline_s": b.baseline_s,
                                            "updated_at": utc(b.updated_at)},
        }

    # -- failures -------------------------------------------------------------------------

    def failures(self, status: str | None = None, program: str | None = None,
                 device: str | None = None, text_filter: str | None = None,
                 before: int | None = None, limit: int = FAILURES_PAGE) -> dict:
        """Non-ok measurements, newest first, filtered; with the counts per status."""
        join = (meas_t.join(trials_t, T.id == M.trial_id)
                .join(structures_t, S.id == T.structure_id)
                .join(programs_t, P.id == S.program_id))
        where = [M.status != "ok"]
        if program:
            where.append(P.name == program)
        if device:
            where.append(M.device_key == device)
        if text_filter:
            where.append(M.message.contains(text_filter, autoescape=True))
        counts_where = list(where)
        if status:
            where.append(M.status == status)
        if before:
            where.append(M.id < before)
        with self.engine.connect() as conn:
            names = {r.id: r.name for r in conn.execute(select(P.id, P.name))}
            totals = self._refresh_totals(conn)
            if text_filter:  # the message is not in the totals: count in SQL
                counts = dict(conn.execute(select(M.status, func.count()).select_from(join)
                                           .where(and_(*counts_where))
                                           .group_by(M.status)).all())
            else:
                counts = {}
                for (pid, dev, st), t in totals.items():
                    if st != "ok" and (not program or names.get(pid) == program) \
                            and (not device or dev == device):
                        counts[st] = counts.get(st, 0) + t[0]
            rows = conn.execute(
                select(M.id, M.status, M.message, M.host, M.measured_at, M.device_key,
                       M.attempt, M.max_error, T.id.label("trial_id"), T.config_json,
                       S.structure_hash, P.name, P.id.label("program_id"), P.shapes_key)
                .select_from(join).where(and_(*where)).order_by(M.id.desc())
                .limit(limit)).all()
            devices = sorted({dev for (_, dev, _) in totals})
        return {
            "counts": {k: int(v) for k, v in sorted(counts.items())},
            "rows": [{"id": r.id, "status": r.status, "message": r.message, "host": r.host,
                      "measured_at": utc(r.measured_at), "device_key": r.device_key,
                      "attempt": r.attempt, "max_error": r.max_error, "trial_id": r.trial_id,
                      "config": loads(r.config_json), "structure_hash": r.structure_hash,
                      "program": r.name, "program_id": r.program_id,
                      "shapes": loads(r.shapes_key)} for r in rows],
            "programs": sorted(set(names.values())), "devices": devices,
            "more": len(rows) == limit, "last_id": rows[-1].id if rows else None,
        }

    def programs_named(self, name: str) -> list[dict]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(P.id, P.shapes_key, P.dtype).where(P.name == name)
                                .order_by(P.id)).all()
        return [{"id": r.id, "shapes": loads(r.shapes_key), "dtype": r.dtype} for r in rows]

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(select(literal(1)))


class _Series:
    """One program × device's first timings, in id order: (id, ok, seconds, measured_at,
    config JSON), and the best-so-far records over them, kept up to date like the totals."""

    def __init__(self) -> None:
        self.low: int | None = None
        self.seen: set[int] = set()
        self.rows: list[tuple] = []
        self.records: list[int] = []  # indexes into rows that beat every earlier ok timing
        self.oks: list[int] = []  # indexes into rows of the ok timings
        self.t0: datetime | None = None
        self.t1: datetime | None = None

    def refresh(self, conn: Any, program_id: int, device_key: str) -> None:
        q = (select(M.id, M.status, M.median_s, M.measured_at, T.config_json)
             .select_from(meas_t.join(trials_t, T.id == M.trial_id)
                          .join(structures_t, S.id == T.structure_id))
             .where(S.program_id == program_id, M.device_key == device_key, M.attempt == 0))
        if self.low is None:
            top = conn.execute(select(func.max(M.id))).scalar() or 0
            self.low = max(0, top - WINDOW)
            self.rows = [(i, st == "ok" and s is not None, s, utc(t), c) for i, st, s, t, c in
                         conn.execute(q.where(M.id <= self.low).order_by(M.id))]
            self._recompute()
        late = False
        top = self.low
        # the rows above the mark are few: take them by primary key and filter here (a filter
        # on the program in SQL lets SQLite walk all of the program's rows instead)
        recent = (select(M.id, M.status, M.median_s, M.measured_at, T.config_json,
                         S.program_id, M.device_key, M.attempt)
                  .select_from(meas_t.join(trials_t, T.id == M.trial_id)
                               .join(structures_t, S.id == T.structure_id))
                  .where(M.id > self.low).order_by(M.id))
        for i, st, s, t, c, pid, dev, attempt in conn.execute(recent):
            top = max(top, i)
            if pid != program_id or dev != device_key or attempt != 0:
                continue
            if i in self.seen:
                continue
            self.seen.add(i)
            row = (i, st == "ok" and s is not None, s, utc(t), c)
            if self.rows and i < self.rows[-1][0]:  # committed after a larger id (PostgreSQL)
                bisect.insort(self.rows, row)
                late = True
                continue
            self.rows.append(row)
            self._time(row[3])
            if row[1]:
                self.oks.append(len(self.rows) - 1)
                if not self.records or s < self.rows[self.records[-1]][2]:
                    self.records.append(len(self.rows) - 1)
        if late:
            self._recompute()
        if top - WINDOW > self.low:
            self.low = top - WINDOW
            self.seen = {i for i in self.seen if i > self.low}

    def _time(self, t: datetime | None) -> None:
        if t is not None:
            self.t0 = t if self.t0 is None else min(self.t0, t)
            self.t1 = t if self.t1 is None else max(self.t1, t)

    def _recompute(self) -> None:
        self.records, self.oks, best = [], [], None
        for k, row in enumerate(self.rows):
            self._time(row[3])
            if row[1]:
                self.oks.append(k)
                if best is None or row[2] < best:
                    best = row[2]
                    self.records.append(k)

    def as_dict(self) -> dict:
        rows, oks, t0, t1 = self.rows, self.oks, self.t0, self.t1
        step = max(1, -(-len(oks) // SCATTER_POINTS))
        return {
            "trials": len(rows), "ok": len(oks), "scatter_step": step,
            "start": iso(t0), "end": iso(t1),
            "best": [{"trial": k + 1, "s": rows[k][2],
                      "t": max(0.0, (rows[k][3] - t0).total_seconds()) if t0 else 0}
                     for k in self.records],
            "scatter": [{"trial": k + 1, "s": rows[k][2], "config": loads(rows[k][4])}
                        for k in oks[step - 1::step]],
        }


UNFINISHED = (TrialState.RUNNING.name, TrialState.WAITING.name)


def _state(value: Any) -> str:
    return str(value).rsplit(".", 1)[-1]


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        return False
