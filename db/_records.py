"""Plain values returned by the database API, its errors, and canonical keys.

Queries return frozen dataclasses rather than ORM rows so that callers never hold objects tied
to a closed session, and so that results can cross process boundaries (Ray) by pickling.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, overload

from db._models import SHAPES_LEN

#: ``structure_hash`` prefix of the structure row standing for the library path (the
#: reference graph run op by op by numpy / CuPy; verification verdict ``library``): its trial
#: has config {} and its measurements are the launch's baseline timings.
LIBRARY_PREFIX = "library:"


class DatabaseError(Exception):
    """Base class of errors raised by ``db``."""


class MissingDriverError(DatabaseError):
    """The database URL needs a driver that is not installed."""


class SchemaError(DatabaseError):
    """The database schema is missing, too old, or newer than this code."""


def canonical_json(value: Any, what: str) -> str:
    """JSON text with sorted keys and no whitespace: equal values give equal text (and keys).

    ``what`` names the argument in the error so the caller knows which input to fix.
    """
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"{what} must be JSON-serializable (dicts, lists, str, int, finite float, bool, None):"
            f" {exc}"
        ) from exc


def json_text(value: Any, what: str) -> str:
    """Canonical JSON of ``value``; a ``str`` is taken as JSON text and canonicalized too."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{what} is a str but not valid JSON text: {exc}") from exc
    return canonical_json(value, what)


def shapes_key(shapes: Any) -> str:
    """The canonical key of a shapes description (a dict of name -> dims, or a list of dims).

    A key string itself is accepted and maps to itself, so callers may pass either form.
    """
    if shapes is None:
        raise ValueError("shapes must be given (e.g. {'x': [16, 1024]} or [[16, 1024]])")
    key = json_text(shapes, "shapes")
    if len(key) > SHAPES_LEN:
        raise ValueError(f"shapes key is {len(key)} characters; at most {SHAPES_LEN} are stored")
    return key


def config_hash(config: Any) -> str:
    """Stable hash of a config (sha256 of its canonical JSON)."""
    return hashlib.sha256(json_text(config, "config").encode()).hexdigest()


def check_key(value: Any, what: str, max_len: int) -> str:
    """A non-empty string of bounded length (it goes into a unique index)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    if len(value) > max_len:
        raise ValueError(f"{what} is {len(value)} characters long; at most {max_len} allowed")
    return value


def check_choice(value: str, what: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{what} must be one of {', '.join(choices)}; got {value!r}")
    return value


def check_time(value: float | None, what: str) -> float | None:
    """A finite, non-negative number of seconds, or None."""
    if value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} must be a number of seconds, got {value!r}") from exc
    if not math.isfinite(out) or out < 0:
        raise ValueError(f"{what} must be finite and >= 0 seconds, got {value!r}")
    return out


@overload
def utc(value: datetime) -> datetime: ...
@overload
def utc(value: None) -> None: ...
def utc(value: datetime | None) -> datetime | None:
    """Aware UTC datetimes from either backend (SQLite returns naive ones, stored as UTC)."""
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


@dataclass(frozen=True)
class JobRecord:
    id: int
    job_key: str
    job_path: str
    status: str
    attempts: int
    started_at: datetime
    finished_at: datetime | None
    timings: dict[str, Any] | None
    resumed: bool  # True when start_job found this job already in the database


@dataclass(frozen=True)
class StructureRecord:
    id: int
    program_id: int
    structure_hash: str
    structure: Any
    verification: Any
    num_kernels: int
    bytes_moved: int | None
    created_at: datetime


@dataclass(frozen=True)
class MeasurementRecord:
    id: int
    trial_id: int
    device_key: str
    attempt: int
    status: str
    median_s: float | None
    spread_s: float | None
    samples: list[float] | None
    max_error: float | None
    message: str | None
    host: str
    measured_at: datetime


@dataclass(frozen=True)
class BestKernel:
    """The cached answer to "fastest verified kernel for this program on this device"."""

    program_hash: str
    shapes_key: str
    dtype: str
    device_key: str
    structure_id: int
    structure_hash: str
    structure: Any
    trial_id: int
    config: Any
    measurement_id: int
    source: str
    time_s: float
    baseline_s: float | None
    updated_at: datetime
    uncertain: str | None = None  # why this best may not be the fastest (None: it is)

    @property
    def speedup(self) -> float | None:
        """Baseline time over best time, when a baseline was recorded."""
        if self.baseline_s is None:
            return None
        return self.baseline_s / self.time_s

    @property
    def library(self) -> bool:
        """The library path (the reference op by op) won: no tuned kernel was faster."""
        return self.structure_hash.startswith(LIBRARY_PREFIX)


@dataclass(frozen=True)
class HistoryEntry:
    """One measurement with the structure and config it measured."""

    measurement_id: int
    trial_id: int
    structure_id: int
    structure_hash: str
    shapes_key: str
    dtype: str
    device_key: str
    config: Any
    study_name: str | None
    trial_number: int | None
    attempt: int
    status: str
    median_s: float | None
    spread_s: float | None
    max_error: float | None
    message: str | None
    host: str
    measured_at: datetime


@dataclass(frozen=True)
class ProgramSummary:
    """What the database holds for one program × shapes × dtype (``tuner status``)."""

    program_id: int
    name: str
    program_hash: str
    shapes_key: str
    dtype: str
    structures: int
    configs: int  # trials: distinct structure × config × device
    timings: int  # measurements, re-timings included
    failed: int  # measurements whose status is not 'ok'
    last_measured_at: datetime | None
