"""Turning a database URL into a configured SQLAlchemy engine.

SQLite is the embedded default: WAL lets readers (``tuner best``, dashboards) run while the
driver writes, a busy timeout makes a second writer wait instead of failing with "database is
locked", and write transactions start with ``BEGIN IMMEDIATE`` so that a transaction that
reads before it writes never has to upgrade its lock (the case a busy timeout cannot save).
PostgreSQL is the shared, many-writer choice; it needs the optional psycopg driver.
"""

from __future__ import annotations

import importlib
import sqlite3
import time
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError
from sqlalchemy.pool import StaticPool

from db._records import DatabaseError, MissingDriverError

DEFAULT_URL = "sqlite:///./tuner.db"
BUSY_TIMEOUT_MS = 30_000
# Execution options marking engines whose transactions write, or that only run single reads.
WRITE_OPTION = "tuner_write"
READ_ONCE_OPTION = "tuner_read_once"

_EXAMPLES = f"{DEFAULT_URL} or postgresql+psycopg://user:password@host:5432/dbname"
_DRIVERS = {"psycopg": "psycopg[binary]", "psycopg2": "psycopg2-binary"}


def normalize_url(url: str | URL | None) -> URL:
    """Parse ``url`` (default ``./tuner.db``); bare ``postgresql://`` means psycopg 3."""
    if url is None:
        url = DEFAULT_URL
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ValueError(f"invalid database URL {str(url)!r}: expected e.g. {_EXAMPLES}") from exc
    backend = parsed.get_backend_name()
    if backend == "postgres":
        parsed = parsed.set(drivername="postgresql")
        backend = "postgresql"
    if backend == "postgresql" and parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    if backend not in ("sqlite", "postgresql"):
        raise ValueError(
            f"unsupported database {backend!r} in URL {parsed.render_as_string()!r}:"
            f" use SQLite or PostgreSQL, e.g. {_EXAMPLES}"
        )
    return parsed


def _check_driver(url: URL) -> None:
    driver = url.get_driver_name()
    package = _DRIVERS.get(driver)
    if package is None:
        return
    try:
        importlib.import_module(driver)
    except ImportError as exc:
        raise MissingDriverError(
            f"database URL {url.render_as_string()!r} needs the {driver} driver, which is not"
            f" installed: pip install '{package}'"
        ) from exc


def sqlite_file(url: URL) -> Path | None:
    database = url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database)


def make_engine(url: URL) -> Engine:
    """An engine for ``url`` with the settings described in the module docstring."""
    _check_driver(url)
    kwargs: dict = {}
    if url.get_backend_name() == "sqlite":
        path = sqlite_file(url)
        if path is None:
            kwargs["poolclass"] = StaticPool  # one shared in-memory database
        elif not path.parent.exists():
            raise DatabaseError(
                f"directory {str(path.parent)!r} of SQLite database {str(path)!r} does not"
                " exist: create it or choose another path"
            )
        kwargs["connect_args"] = {"check_same_thread": False}
    else:
        kwargs["pool_pre_ping"] = True
    try:
        engine = create_engine(url, **kwargs)
    except NoSuchModuleError as exc:
        raise MissingDriverError(f"no SQLAlchemy dialect for {url.drivername!r}: {exc}") from exc
    if url.get_backend_name() == "sqlite":
        _configure_sqlite(engine)
    return engine


def _journal_wal(cursor) -> None:
    """Switch the file to WAL (a no-op once it is).  A fresh file's switch needs it alone, and
    SQLite answers "database is locked" at once, without its busy handler, while another
    process is opening it too (one of four launches started at the same instant failed so):
    try again until the busy timeout."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:
        # Let SQLAlchemy's "begin" event (below) issue BEGIN, not the sqlite3 module.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        _journal_wal(cursor)
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")  # durable across crashes of the process
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection) -> None:
        options = connection.get_execution_options()
        if options.get(READ_ONCE_OPTION, False):
            return  # a lone SELECT is its own consistent snapshot; skip BEGIN/ROLLBACK
        connection.exec_driver_sql("BEGIN IMMEDIATE" if options.get(WRITE_OPTION) else "BEGIN")


def write_engine(engine: Engine) -> Engine:
    """The same engine (and pool), marked so that its transactions begin as writers."""
    return engine.execution_options(**{WRITE_OPTION: True})


def read_once_engine(engine: Engine) -> Engine:
    """The same engine (and pool) for single-statement reads, without transaction round trips.

    Lookups (``tuner best``) are one SELECT each, which every backend runs atomically; skipping
    BEGIN / ROLLBACK saves two round trips per lookup on PostgreSQL.
    """
    if engine.dialect.name == "sqlite":
        return engine.execution_options(**{READ_ONCE_OPTION: True})
    return engine.execution_options(isolation_level="AUTOCOMMIT")
