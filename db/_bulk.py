"""Many trials and their first measurements written in one transaction.

A trial written alone costs three transactions (trial, measurement, best kernel), and on
SQLite each commit is a file sync: the dataset's fast path measures a batch of configs of one
structure at a time and stores the batch at once with ``record_trials``.  Each batch is
committed as soon as it is measured (a few seconds of work), so a killed run loses at most
the batch in flight.  The writes are idempotent like every other (a config already stored for
the structure and device keeps its first trial and measurement).
"""

from __future__ import annotations

import math
import socket
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from db._models import KEY_LEN, MEASUREMENT_STATUSES, MeasurementRow, TrialRow, utcnow
from db._records import check_choice, check_key, check_time, config_hash, json_text
from kernels import OK

if TYPE_CHECKING:
    from db._store import Database

MAX_MESSAGE = 65_536


def record_trials(database: Database, structure_id: int, device_key: str,
                  results: Sequence[Mapping[str, Any]], *, study_name: str | None = None
                  ) -> list[int]:
    """Store each result (``Device.run_trial``'s dict: ``config``, ``status``, ``median_s``,
    ``spread_s``, ``samples``, ``max_error``, ``message``, ``host``) as a trial of
    ``structure_id`` on ``device_key`` with its first measurement, all in one transaction;
    returns the measurement ids, in order.  Results whose status is not a measurement status
    (a config that did not lower) are not stored (id -1)."""
    device_key = check_key(device_key, "device_key", KEY_LEN)
    now = utcnow()
    rows: list[tuple[dict[str, Any], dict[str, Any]] | None] = []
    for r in results:
        status = r["status"]
        if status not in MEASUREMENT_STATUSES:
            rows.append(None)
            continue
        check_choice(status, "measurement status", MEASUREMENT_STATUSES)
        ok = status == OK
        median = check_time(r.get("median_s") if ok else None, "median_s")
        if ok and not median:
            raise ValueError(f"config {r['config']}: a measurement with status 'ok' needs "
                             "median_s > 0")
        samples = r.get("samples") if ok else None
        err = r.get("max_error")
        rows.append((
            {"structure_id": structure_id, "device_key": device_key,
             "config_hash": config_hash(r["config"]),
             "config_json": json_text(r["config"], "config"), "study_name": study_name,
             "trial_number": None, "created_at": now},
            {"device_key": device_key, "attempt": 0, "status": status, "median_s": median,
             "spread_s": check_time(r.get("spread_s") if ok else None, "spread_s"),
             "samples_json": None if samples is None else json_text(
                 [check_time(x, "samples[]") for x in samples], "samples"),
             "max_error": None if err is None else (math.inf if math.isnan(float(err))
                                                    else float(err)),
             "message": (str(r["message"])[:MAX_MESSAGE] or None) if r.get("message")
             else None,
             "host": check_key(r.get("host") or socket.gethostname(), "host", KEY_LEN),
             "measured_at": now}))
    ids = []
    with database.session() as s:
        for row in rows:
            if row is None:
                ids.append(-1)
                continue
            trial, measurement = row
            tid, _ = database._insert_id(s, TrialRow, trial,
                                         ("structure_id", "device_key", "config_hash"))
            mid, _ = database._insert_id(s, MeasurementRow, {"trial_id": tid, **measurement},
                                         ("trial_id", "device_key", "attempt"))
            ids.append(mid)
    return ids
