"""A chart's series, kept in memory: per program × device, the best-so-far curve (only the first
timings that beat every earlier one) and a scatter of every first timing, thinned to at most
``SCATTER_POINTS`` points.

A program × device's first timings are read once, then only the new ones, as the counts are
(a low-water mark trailing the newest measurement id by ``window``, see ``counts``); the answer
is kept until that program × device gets a new timing.  Only the ``SERIES_KEPT`` most recently
read series are kept up to date.
"""

from __future__ import annotations

import bisect
import threading
from datetime import datetime
from typing import Any

from sqlalchemy import func, select

from .counts import WINDOW
from .tables import MEASURED, OK, M, S, T
from .views import iso, loads, utc

SCATTER_POINTS = 1500
SERIES_KEPT = 32  # program x device series kept up to date in memory (the most recently read)
ANSWERS_KEPT = 256


class Series:
    """One program × device's first timings, in id order: (id, ok, seconds, measured_at,
    config JSON), and the best-so-far records over them."""

    def __init__(self, window: int = WINDOW) -> None:
        self.window = window
        self.low: int | None = None
        self.seen: set[int] = set()
        self.rows: list[tuple] = []
        self.records: list[int] = []  # indexes into rows that beat every earlier ok timing
        self.oks: list[int] = []  # indexes into rows of the ok timings
        self.t0: datetime | None = None
        self.t1: datetime | None = None

    def refresh(self, conn: Any, program_id: int, device_key: str) -> None:
        columns = (M.id, M.status, M.median_s, M.measured_at, T.config_json)
        if self.low is None:
            top = conn.execute(select(func.max(M.id))).scalar() or 0
            self.low = max(0, top - self.window)
            first = (select(*columns).select_from(MEASURED)
                     .where(S.program_id == program_id, M.device_key == device_key,
                            M.attempt == 0, M.id <= self.low).order_by(M.id))
            self.rows = [(i, st == OK and s is not None, s, utc(t), c)
                         for i, st, s, t, c in conn.execute(first)]
            self._recompute()
        late = False
        top = self.low
        # the rows above the mark are few: take them by primary key and filter here (a filter
        # on the program in SQL lets SQLite walk all of the program's rows instead)
        recent = (select(*columns, S.program_id, M.device_key, M.attempt)
                  .select_from(MEASURED).where(M.id > self.low).order_by(M.id))
        for i, st, s, t, c, pid, dev, attempt in conn.execute(recent):
            top = max(top, i)
            if pid != program_id or dev != device_key or attempt != 0:
                continue
            if i in self.seen:
                continue
            self.seen.add(i)
            row = (i, st == OK and s is not None, s, utc(t), c)
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
        if top - self.window > self.low:
            self.low = top - self.window
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


class SeriesCache:
    """The series of the program × devices read lately (thread-safe)."""

    def __init__(self, window: int = WINDOW) -> None:
        self.window = window
        self._answers: dict[tuple, dict] = {}  # (program, device, timings there) -> series
        self._states: dict[tuple[int, str], Series] = {}  # most recently read last
        self._lock = threading.Lock()

    def get(self, conn: Any, program_id: int, device_key: str, timings: int) -> dict:
        """The series, given how many timings the program × device has now (its version)."""
        version = (program_id, device_key, timings)
        with self._lock:
            cached = self._answers.get(version)
            if cached is not None:  # nothing was measured there since
                return cached
            state = self._states.pop((program_id, device_key), None) or Series(self.window)
            try:
                state.refresh(conn, program_id, device_key)
            finally:
                self._states[(program_id, device_key)] = state
                while len(self._states) > SERIES_KEPT:
                    self._states.pop(next(iter(self._states)))
            out = state.as_dict()
            if len(self._answers) > ANSWERS_KEPT:
                self._answers.clear()
            self._answers[version] = out
            return out
