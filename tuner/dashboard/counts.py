"""Counts that grow with the number of measurements, kept up to date incrementally: what each
program × device × status has measured, and the Optuna trial states of each program × device.

The first read aggregates in SQL (grouped queries); later reads take only the rows above a
low-water mark.  Measurements and Optuna trials are only ever appended, so counts only grow.
The mark trails the newest id by ``window`` and those ids are re-read every time, because on
PostgreSQL a transaction may commit a smaller id after a larger one was seen; the ids counted
above the mark are remembered, so nothing is counted twice.
"""

from __future__ import annotations

import threading
from typing import Any

from optuna.trial import TrialState
from sqlalchemy import case, func, select

from .tables import MEASURED, OK, M, S, T, otrials_t, structures_t, studies_t, trials_t
from .views import utc

WINDOW = 1000  # trailing ids re-read on every refresh
UNFINISHED = (TrialState.RUNNING, TrialState.WAITING)
BATCH = 500  # ids per IN (...) list

# per (program id, device key, status): [timings, first timings, first measured_at,
# last measured_at, fastest ok first timing]
Totals = dict[tuple[int, str, str], list]


class MeasurementTotals:
    """Per program × device × status: timings, first timings (attempt 0), first and last time,
    the fastest ok first timing (thread-safe)."""

    def __init__(self, window: int = WINDOW) -> None:
        self.window = window
        self._totals: Totals = {}
        self._low: int | None = None  # every measurement with id <= this is counted
        self._seen: set[int] = set()  # ids > _low already counted
        self._lock = threading.Lock()

    def refresh(self, conn: Any) -> Totals:
        """The totals brought up to date (a copy)."""
        with self._lock:
            if self._low is None:
                top = conn.execute(select(func.max(M.id))).scalar() or 0
                low = max(0, top - self.window)
                agg = (select(S.program_id, M.device_key, M.status, func.count(),
                              func.sum(case((M.attempt == 0, 1), else_=0)),
                              func.min(M.measured_at), func.max(M.measured_at),
                              func.min(case((M.attempt == 0, M.median_s), else_=None)))
                       .select_from(MEASURED).where(M.id <= low)
                       .group_by(S.program_id, M.device_key, M.status))
                for pid, dev, status, n, firsts, first, last, fastest in conn.execute(agg):
                    self._totals[(pid, dev, status)] = [int(n), int(firsts or 0), utc(first),
                                                        utc(last), fastest]
                self._low = low
            rows = conn.execute(
                select(M.id, S.program_id, M.device_key, M.status, M.attempt,
                       M.measured_at, M.median_s).select_from(MEASURED)
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
                    if status == OK and median is not None:
                        t[4] = median if t[4] is None else min(t[4], median)
            if top - self.window > self._low:
                self._low = top - self.window
                self._seen = {i for i in self._seen if i > self._low}
            return {k: list(v) for k, v in self._totals.items()}


class OptunaStates:
    """Per (program, device): Optuna trials by state (COMPLETE / PRUNED = skipped unmeasured:
    by the roofline, or a config that does not lower / FAIL / RUNNING), kept up to date like the measurement totals.  Optuna's trials
    are appended, and change state only from RUNNING / WAITING to a final one: final ones are
    counted once, the unfinished ones remembered and looked at again on each refresh."""

    def __init__(self, window: int = WINDOW) -> None:
        self.window = window
        self._low: int | None = None
        self._seen: set[int] = set()
        self._pending: dict[int, int] = {}  # unfinished trial id -> study id
        self._counts: dict[int, dict[str, int]] = {}  # study id -> final state -> trials
        self._study: dict[int, tuple[int, str]] = {}  # study id -> (program id, device key)
        self._lock = threading.Lock()

    def refresh(self, conn: Any) -> dict[tuple[int, str], dict[str, int]]:
        """Raises what reading an absent table raises when Optuna's tables are not there."""
        o = otrials_t.c
        with self._lock:
            if self._low is None:
                top = conn.execute(select(func.max(o.trial_id))).scalar() or 0
                low = max(0, top - self.window)
                counts: dict[int, dict[str, int]] = {}
                for sid, state, n in conn.execute(
                        select(o.study_id, o.state, func.count()).where(o.trial_id <= low)
                        .group_by(o.study_id, o.state)):
                    if _state(state) not in _UNFINISHED:
                        c = counts.setdefault(sid, {})
                        c[_state(state)] = c.get(_state(state), 0) + int(n)
                unfinished = dict(conn.execute(select(o.trial_id, o.study_id).where(
                    o.trial_id <= low, o.state.in_(UNFINISHED))).all())
                self._low, self._counts, self._pending = low, counts, unfinished
            rows = conn.execute(select(o.trial_id, o.study_id, o.state)
                                .where(o.trial_id > self._low).order_by(o.trial_id)).all()
            pending = list(self._pending)
            for i in range(0, len(pending), BATCH):
                rows += conn.execute(select(o.trial_id, o.study_id, o.state)
                                     .where(o.trial_id.in_(pending[i:i + BATCH]))).all()
            top = self._low
            for tid, sid, state in rows:
                state = _state(state)
                if tid > self._low:
                    top = max(top, tid)
                if tid in self._seen and tid not in self._pending:
                    continue
                self._seen.add(tid)
                if state in _UNFINISHED:
                    self._pending[tid] = sid
                    continue
                self._pending.pop(tid, None)
                c = self._counts.setdefault(sid, {})
                c[state] = c.get(state, 0) + 1
            if top - self.window > self._low:
                self._low = top - self.window
                self._seen = {t for t in self._seen if t > self._low}
            self._find_studies(conn)
            out: dict[tuple[int, str], dict[str, int]] = {}
            for sid, by_state in self._counts.items():
                key = self._study.get(sid)
                if key is None:
                    continue
                agg = out.setdefault(key, {})
                for state, n in by_state.items():
                    agg[state] = agg.get(state, 0) + n
            for sid in self._pending.values():
                key = self._study.get(sid)
                if key is not None:
                    agg = out.setdefault(key, {})
                    agg[TrialState.RUNNING.name] = agg.get(TrialState.RUNNING.name, 0) + 1
            return out

    def _find_studies(self, conn: Any) -> None:
        """Which program × device each study tunes: its name, in our trials (a study is
        looked up once; one whose trials are not stored yet is tried again)."""
        unknown = [sid for sid in set(self._counts) | set(self._pending.values())
                   if sid not in self._study]
        if not unknown:
            return
        names = dict(conn.execute(select(studies_t.c.study_id, studies_t.c.study_name)
                                  .where(studies_t.c.study_id.in_(unknown))).all())
        if not names:
            return
        found = {n: (pid, dev) for n, pid, dev in conn.execute(
            select(T.study_name, S.program_id, T.device_key).distinct()
            .select_from(trials_t.join(structures_t, S.id == T.structure_id))
            .where(T.study_name.in_(list(names.values()))))}
        for sid, name in names.items():
            if name in found:
                self._study[sid] = found[name]


_UNFINISHED = {s.name for s in UNFINISHED}


def _state(value: Any) -> str:
    """A trial state's name, whether read as Optuna's enum or as its stored text."""
    return value.name if isinstance(value, TrialState) else str(value).rsplit(".", 1)[-1]
