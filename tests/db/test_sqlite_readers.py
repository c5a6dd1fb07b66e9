"""A reader opening and closing the SQLite database while a launch writes (`tuner best`,
`tuner status --watch`) must not lose the launch's writes.

Until 2026-11-24 it did: the launch's schema lock closed a descriptor of the database file,
which drops every POSIX lock the process holds on it, SQLite's included; the reader's last
connection then took the database for unused, checkpointed and deleted the WAL, and every
later write of the launch went into the deleted file (the launch exited 0 with nothing
stored).  tests/tuner/test_concurrent_launches.py runs the same thing through `tuner launch`.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import db

READ = "import db, sys; d = db.connect(sys.argv[1], migrate_schema=False); d.jobs(); d.close()"


def test_a_reader_closing_its_connection_loses_no_write_after_the_schema_lock(
        tmp_path: Path) -> None:
    path = tmp_path / "tuner.db"
    url = f"sqlite:///{path}"
    database = db.connect(url)
    watcher = sqlite3.connect(path)  # a reader still connected when the launch ends
    try:
        with database.schema_lock():  # what every launch does before Optuna's set-up
            pass
        database.start_job("first", "a.yaml")
        subprocess.run([sys.executable, "-c", READ, url], check=True, timeout=120)
        database.start_job("second", "a.yaml")  # written after that reader closed
        watcher.execute("SELECT count(*) FROM tuner_jobs").fetchall()
    finally:
        database.close()
    keys = {k for (k,) in watcher.execute("SELECT job_key FROM tuner_jobs")}
    watcher.close()
    assert keys == {"first", "second"}
