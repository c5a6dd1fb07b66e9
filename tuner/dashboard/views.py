"""What the dashboard's pages show: a program's progress on each device, and the text forms of
times, durations and shapes that only the dashboard writes (milliseconds and configs are
``tuner.formatting``'s, shared with the CLI).

These are plain values built by ``reader.Reader``; ``as_dict`` is their JSON form (the APIs),
and the templates read the same dicts, so a page and its API cannot disagree.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from optuna.trial import TrialState

from .tables import OK


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
        return self.optuna.get(TrialState.PRUNED.name, 0)

    def as_dict(self) -> dict:
        best = self.best
        return {"device_key": self.device_key, "trials": self.trials, "timings": self.timings,
                "statuses": self.statuses, "failed": self.failed,
                "ok": self.statuses.get(OK, 0),
                "failed_trials": self.trials - self.statuses.get(OK, 0),
                "failed_text": ", ".join(f"{k} {v}" for k, v in sorted(self.statuses.items())
                                         if k != OK and v), "skipped": self.skipped,
                "optuna": self.optuna, "first_at": iso(self.first_at),
                "last_at": iso(self.last_at), "best_first_s": self.best_first_s,
                "best": None if best is None else {
                    k: (iso(v) if isinstance(v, datetime) else v) for k, v in best.items()}}


@dataclass
class ProgramProgress:
    """A stored program (one ``db.ProgramRow``) with its search and its tuning on each
    device: one block of rows of a job's or a program's table."""

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


def utc(value: Any) -> datetime | None:
    """A stored time as an aware UTC datetime (SQLite hands back naive ones, or text)."""
    if value is None:
        return None
    if isinstance(value, str):  # a backend that hands back text
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else \
        value.astimezone(timezone.utc)


def iso(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat()


def loads(value: str | None) -> Any:
    return None if value is None else json.loads(value)


def shapes_text(shapes: Any) -> str:
    """``X=64x64 R=64x64``."""
    if isinstance(shapes, dict):
        return " ".join(f"{k}={'x'.join(map(str, v))}" for k, v in shapes.items())
    return json.dumps(shapes)


def when(t: datetime | str | None) -> str:
    """A time to the second (UTC, as stored); ``-`` for none."""
    if t is None:
        return "-"
    if isinstance(t, str):
        t = datetime.fromisoformat(t)
    return f"{t:%Y-%m-%d %H:%M:%S}"


def duration(seconds: float | None) -> str:
    """``1h02m``, ``3m05s``, ``42s``; ``-`` for none."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"
