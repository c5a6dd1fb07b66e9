"""The dashboard's queries: jobs, programs with their progress on each device, one kernel,
failures and chart series, over one read-only engine (``tables``).

Everything that grows with the number of measurements is aggregated in SQL or kept up to date
incrementally (``counts``, ``series``), never re-read on every poll.
"""

from __future__ import annotations

import threading
from typing import Any

from sqlalchemy import Engine, and_, case, func, literal, or_, select

from .counts import WINDOW, MeasurementTotals, OptunaStates
from .series import SeriesCache
from .tables import (
    FINISHED,
    MEASURED,
    MISSING_TABLE,
    OK,
    M,
    P,
    S,
    T,
    best_t,
    jobs_t,
    programs_t,
    read_only_engine,
    savepoint,
    shards_t,
    shown_url,
    structures_t,
    studies_t,
    trials_t,
)
from .views import DeviceProgress, ProgramProgress, loads, utc

FAILURES_PAGE = 200
BATCH = 500  # ids per IN (...) list
REFERENCE = '%"verdict":"reference"%'  # a structure that is the program as written


class Reader:
    """The dashboard's queries over one read-only engine (thread-safe; one per app).
    ``window``: trailing measurement ids re-read on every refresh (see ``counts``)."""

    def __init__(self, url: Any, engine: Engine | None = None, window: int = WINDOW) -> None:
        self.url = shown_url(url)
        self.engine = engine or read_only_engine(url)
        self._shard_stats: dict[int, tuple[int, int]] = {}  # shard id -> (states, verified)
        self._lock = threading.Lock()
        self._totals = MeasurementTotals(window)
        self._optuna = OptunaStates(window)
        self._series = SeriesCache(window)

    def close(self) -> None:
        self.engine.dispose()

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(select(literal(1)))

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
                shards_t.c.job_id == job_id, shards_t.c.status == FINISHED)).all()
            missing = [r.id for r in rows if r.id not in self._shard_stats]
            for i in range(0, len(missing), BATCH):
                for sid, stats in conn.execute(select(shards_t.c.id, shards_t.c.stats_json)
                                               .where(shards_t.c.id.in_(missing[i:i + BATCH]))):
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
                 optuna: bool = True) -> list[ProgramProgress]:
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
            progs: dict[int, ProgramProgress] = {}
            by_key: dict[tuple[str, str, str], ProgramProgress] = {}  # best kernels' key
            for r in conn.execute(stmt):
                progs[r.id] = by_key[(r.program_hash, r.shapes_key, r.dtype)] = ProgramProgress(
                    r.id, r.name, r.program_hash, loads(r.shapes_key), r.dtype,
                    created_at=utc(r.created_at))
            if not progs:
                return []
            pids = list(progs)
            for pid, n, ref in conn.execute(
                    select(S.program_id, func.count(),
                           func.sum(case((S.verification_json.like(REFERENCE), 1), else_=0)))
                    .where(S.program_id.in_(pids)).group_by(S.program_id)):
                progs[pid].structures, progs[pid].verified = int(n), int(n) - int(ref or 0)
            for (pid, dev, status), (n, firsts, first, last, fastest) in \
                    self._totals.refresh(conn).items():
                if pid not in progs:
                    continue
                d = progs[pid].devices.setdefault(dev, DeviceProgress(dev))
                d.timings += n
                d.trials += firsts
                if firsts:
                    d.statuses[status] = d.statuses.get(status, 0) + firsts
                if status != OK:
                    d.failed += n
                d.first_at = first if d.first_at is None else min(d.first_at, first)
                d.last_at = last if d.last_at is None else max(d.last_at, last)
                if status == OK and fastest is not None:
                    d.best_first_s = fastest
            b = best_t.c
            best = (select(b.program_hash, b.shapes_key, b.dtype, b.device_key, b.trial_id,
                           b.structure_id, b.time_s, b.baseline_s, b.updated_at,
                           b.uncertain, S.structure_hash, T.config_json)
                    .select_from(best_t.join(structures_t, S.id == b.structure_id)
                                 .join(trials_t, T.id == b.trial_id))
                    .where(b.program_hash.in_({p.program_hash for p in progs.values()})))
            for k in conn.execute(best):
                p = by_key.get((k.program_hash, k.shapes_key, k.dtype))
                if p is None:
                    continue
                d = p.devices.setdefault(k.device_key, DeviceProgress(k.device_key))
                d.best = {"trial_id": k.trial_id, "structure_id": k.structure_id,
                          "structure_hash": k.structure_hash, "config": loads(k.config_json),
                          "time_s": k.time_s, "baseline_s": k.baseline_s,
                          "speedup": (k.baseline_s / k.time_s) if k.baseline_s else None,
                          "updated_at": utc(k.updated_at), "uncertain": k.uncertain}
            if optuna:
                self._optuna_states(conn, progs)
        return list(progs.values())

    def _optuna_states(self, conn: Any, progs: dict[int, ProgramProgress]) -> None:
        """Optuna's trial states of each program × device's studies; nothing when Optuna's
        tables are not there."""
        try:
            with savepoint(conn):
                states = self._optuna.refresh(conn)
        except MISSING_TABLE:
            return
        for (pid, dev), counts in states.items():
            if pid in progs:
                d = progs[pid].devices.setdefault(dev, DeviceProgress(dev))
                for state, n in counts.items():
                    d.optuna[state] = d.optuna.get(state, 0) + n

    def has_program(self, program_id: int) -> bool:
        with self.engine.connect() as conn:
            return conn.execute(select(P.id).where(P.id == program_id)).first() is not None

    # -- charts ---------------------------------------------------------------------------

    def series(self, program_id: int, device_key: str) -> dict:
        """The best-so-far curve (with each record's trial number and time) and a thinned
        scatter of every first timing of a program × device, in the order they were stored
        (see ``series``)."""
        with self.engine.connect() as conn:
            timings = sum(t[0] for (pid, dev, _), t in self._totals.refresh(conn).items()
                          if pid == program_id and dev == device_key)
            return self._series.get(conn, program_id, device_key, timings)

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
            ms = conn.execute(select(M.id, M.attempt, M.status, M.median_s, M.spread_s,
                                     M.samples_json, M.max_error, M.message, M.host,
                                     M.measured_at)
                              .where(M.trial_id == trial_id).order_by(M.attempt, M.id)).all()
            b = best_t.c
            best = conn.execute(select(b.source, b.time_s, b.baseline_s, b.updated_at,
                                       b.uncertain).where(b.trial_id == trial_id)).first()
            study_id = None
            if r.study_name:
                try:
                    with savepoint(conn):
                        study_id = conn.execute(select(studies_t.c.study_id).where(
                            studies_t.c.study_name == r.study_name)).scalar()
                except MISSING_TABLE:
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
            "best": None if best is None else {"source": best.source, "time_s": best.time_s,
                                               "baseline_s": best.baseline_s,
                                               "updated_at": utc(best.updated_at),
                                               "uncertain": best.uncertain},
        }

    # -- failures -------------------------------------------------------------------------

    def failures(self, status: str | None = None, program: str | None = None,
                 device: str | None = None, text_filter: str | None = None,
                 before: int | None = None, limit: int = FAILURES_PAGE) -> dict:
        """Non-ok measurements, newest first, filtered; with the counts per status."""
        join = MEASURED.join(programs_t, P.id == S.program_id)
        where = [M.status != OK]
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
            totals = self._totals.refresh(conn)
            counts: dict[str, int]
            if text_filter:  # the message is not in the totals: count in SQL
                counts = dict(conn.execute(select(M.status, func.count()).select_from(join)
                                           .where(and_(*counts_where))
                                           .group_by(M.status)).all())
            else:
                counts = {}
                for (pid, dev, st), t in totals.items():
                    if st != OK and (not program or names.get(pid) == program) \
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
