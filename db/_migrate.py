"""Running the packaged Alembic migrations programmatically (``tuner db upgrade``).

The migrations live inside the package (``db/migrations``) so that an installed tuner can
upgrade any database it meets, without an alembic.ini. A new database is brought to the head
revision by running every migration from empty: the same path an old database takes, so the
two can never disagree.

Our migrations serialize themselves (``BEGIN IMMEDIATE`` on SQLite, a transaction-level
advisory lock on PostgreSQL).  Optuna's storage, which shares the database, does not: it looks
for its tables, creates the missing ones and stamps its version rows in separate steps, so two
``tuner launch`` started at once on a fresh database failed with "table studies already exists"
or a UNIQUE violation on its ``alembic_version``.  ``schema_lock`` makes such set-ups take
turns: an ``flock`` on the SQLite database file (independent of SQLite's own POSIX locks, on a
descriptor never closed: see ``_lock_handle``) or a
session-level PostgreSQL advisory lock on a connection of its own.  Both end with the process
that holds them, however it ends.
"""

from __future__ import annotations

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, Engine, inspect

from db._engine import sqlite_file, write_engine
from db._models import PREFIX, VERSION_TABLE, Base
from db._records import SchemaError

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# Arbitrary constant naming the PostgreSQL advisory lock that serializes concurrent upgrades.
_PG_LOCK_ID = 7_362_514_001
# ... and the session-level one that ``schema_lock`` holds while others create their tables.
_PG_SCHEMA_LOCK_ID = 7_362_514_002


def include_object(obj, name, type_, reflected, compare_to) -> bool:
    """Only tuner tables (and their columns, indexes...) take part in schema comparison."""
    if type_ == "table":
        return bool(name) and name.startswith(PREFIX)
    table = getattr(obj, "table", None)
    return table is None or table.name.startswith(PREFIX)


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config pointing at the packaged migrations (and at ``connection``)."""
    if not (MIGRATIONS_DIR / "env.py").is_file():
        raise SchemaError(
            f"migrations not found at {MIGRATIONS_DIR}: the package was installed without its"
            " data files (package-data must include db/migrations/*.py, versions/*.py, *.mako)"
        )
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest revision this code knows."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "db/migrations/versions has no revisions"
    return head


def revision_of(connection: Connection) -> str | None:
    """The revision recorded in the database, or None for a database without our tables."""
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return revision_of(connection)


def _run(engine: Engine, action: str, revision: str) -> None:
    with write_engine(engine).begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_LOCK_ID})")
        current = revision_of(connection)
        known = {s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions()}
        if current is not None and current not in known:
            raise SchemaError(
                f"the database is at tuner schema revision {current!r}, which this version of"
                " tuner does not know (it was written by a newer tuner): upgrade tuner"
            )
        if current is None and action == "upgrade":
            tables = inspect(connection).get_table_names()
            clash = sorted(t for t in tables if t.startswith(PREFIX) and t != VERSION_TABLE)
            if clash:
                raise SchemaError(
                    f"tables {', '.join(clash)} exist but {VERSION_TABLE} records no revision:"
                    " this database was not created by tuner's migrations; use a fresh database"
                )
        try:
            if action == "upgrade":
                command.upgrade(alembic_config(connection), revision)
            else:
                command.downgrade(alembic_config(connection), revision)
        except CommandError as exc:
            raise SchemaError(f"cannot {action} the tuner schema to {revision!r}: {exc}") from exc


def schema_diff(engine: Engine) -> list:
    """Differences between the models and the database's tuner tables ([] when in step)."""
    with engine.connect() as connection:
        context = MigrationContext.configure(
            connection,
            opts={
                "version_table": VERSION_TABLE,
                "include_object": include_object,
                "compare_type": True,
            },
        )
        return compare_metadata(context, Base.metadata)


def upgrade_engine(engine: Engine, revision: str = "head") -> None:
    """Bring the tuner tables to ``revision`` (idempotent: a database at it is left alone)."""
    _run(engine, "upgrade", revision)


def downgrade_engine(engine: Engine, revision: str) -> None:
    """Take the tuner tables back to ``revision`` ("base" drops them all)."""
    _run(engine, "downgrade", revision)


@contextmanager
def schema_lock(engine: Engine) -> Iterator[None]:
    """Hold a lock, across processes, while another library sharing the database sets up its
    tables (see the module docstring); a no-op for an in-memory SQLite database."""
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.exec_driver_sql(f"SELECT pg_advisory_lock({_PG_SCHEMA_LOCK_ID})")
            try:
                yield
            finally:
                connection.exec_driver_sql(f"SELECT pg_advisory_unlock({_PG_SCHEMA_LOCK_ID})")
        return
    path = sqlite_file(engine.url)
    if path is None or fcntl is None:  # in memory: one process's; no flock on Windows
        yield
        return
    handle = _lock_handle(path)
    fcntl.flock(handle, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)


_LOCK_HANDLES: dict[str, BinaryIO] = {}


def _lock_handle(path: Path) -> BinaryIO:
    """A handle on the database file itself (created empty if missing), opened once per
    process and never closed.  Closing any descriptor of a file drops every POSIX lock the
    process holds on it, SQLite's included: a launch that closed this handle lost the locks
    that mark its connections as live, so a reader closing its last connection (`tuner best`,
    `tuner status --watch`) took the database for unused, checkpointed and deleted the WAL,
    and everything the launch wrote afterwards went into the deleted file."""
    key = str(path.resolve())
    if key not in _LOCK_HANDLES:
        _LOCK_HANDLES[key] = open(path, "ab")  # noqa: SIM115 - held for the process's life
    return _LOCK_HANDLES[key]
