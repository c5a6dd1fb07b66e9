"""Alembic environment for the tuner tables, driven only from ``db._migrate``.

It runs on the connection that ``db._migrate`` passes in ``config.attributes`` (no alembic.ini,
no URL here), keeps its revision in ``tuner_alembic_version`` so that Optuna's own
``alembic_version`` table in the same database is never touched, and looks only at tables
prefixed ``tuner_`` when comparing the models with the database.
"""

from __future__ import annotations

from alembic import context

from db._migrate import include_object
from db._models import VERSION_TABLE, Base


def run_migrations() -> None:
    connection = context.config.attributes.get("connection")
    if connection is None:
        raise RuntimeError(
            "db/migrations is run by db._migrate (tuner db upgrade), not by the alembic command"
        )
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        version_table=VERSION_TABLE,
        include_object=include_object,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


run_migrations()
