"""The ``Database`` handle: the engine, its session makers, the schema it is at.

What a handle does with its connection lives beside it: the reads in ``_queries`` (``Reads``),
the sessions and idempotent writes in ``_writes`` (``Writes``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from sqlalchemy import Engine
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import sessionmaker

from db import _migrate
from db._engine import read_once_engine, write_engine
from db._queries import Reads
from db._writes import Writes


class Database(Reads, Writes):
    """A connected tuner database. Create it with ``db.connect(url)``."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self._insert = sqlite_insert if self.dialect == "sqlite" else pg_insert
        self._writer = sessionmaker(bind=write_engine(engine), expire_on_commit=False)
        self._reader = sessionmaker(bind=engine, expire_on_commit=False)
        self._lookup = read_once_engine(engine)

    @property
    def url(self) -> str:
        """The URL with its password, e.g. to hand to ``optuna.storages.RDBStorage``."""
        return self.engine.url.render_as_string(hide_password=False)

    def __repr__(self) -> str:
        return f"Database({self.engine.url.render_as_string(hide_password=True)!r})"

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- schema ---------------------------------------------------------------------------

    def upgrade(self, revision: str = "head") -> str | None:
        """Run the packaged migrations up to ``revision``; returns the revision now current."""
        _migrate.upgrade_engine(self.engine, revision)
        return self.current_revision()

    def downgrade(self, revision: str) -> str | None:
        """Take the tuner tables back to ``revision`` ("base" drops them all)."""
        _migrate.downgrade_engine(self.engine, revision)
        return self.current_revision()

    def current_revision(self) -> str | None:
        return _migrate.current_revision(self.engine)

    def schema_diff(self) -> list:
        """Differences between the models and this database's tuner tables ([]: in step)."""
        return _migrate.schema_diff(self.engine)

    def schema_lock(self) -> AbstractContextManager[None]:
        """A lock, across processes, to hold while another library sharing this database
        (Optuna's storage) creates its tables: two launches at once on a fresh database
        would otherwise both try to create them."""
        return _migrate.schema_lock(self.engine)
