"""Fixtures shared by the test modules: database URLs.

PostgreSQL tests run when TUNER_TEST_POSTGRES_URL is set (``.ci/postgres.sh`` starts a server
and prints one); each test gets a fresh schema on that server, dropped afterwards.

Tests marked ``serial`` need a quiet machine (they read its load, or time kernels against one):
in a parallel run (``pytest -n 2``, pytest-xdist) the other process is the load, so they skip
there, saying so; ``make test`` runs them after it, alone (``pytest -m serial``).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

import db

PG_ENV = "TUNER_TEST_POSTGRES_URL"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    skip = pytest.mark.skip(reason="needs a quiet machine, and this run is parallel (pytest -n): "
                                   "make test runs it alone afterwards (pytest -m serial)")
    for item in items:
        if item.get_closest_marker("serial"):
            item.add_marker(skip)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'tuner.db'}"


@pytest.fixture
def pg_url():
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"PostgreSQL tests need {PG_ENV} (e.g. from `bash .ci/postgres.sh`)")
    pytest.importorskip("psycopg", reason="PostgreSQL tests need: pip install 'psycopg[binary]'")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(db.normalize_url(base))
    with admin.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    url = db.normalize_url(base).update_query_dict({"options": f"-csearch_path={schema}"})
    yield url.render_as_string(hide_password=False)
    with admin.begin() as conn:
        conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
    admin.dispose()
