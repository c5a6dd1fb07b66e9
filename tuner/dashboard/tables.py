"""What the dashboard reads and how: db's own tables and Optuna's, through an engine that
cannot write.

The tables are their owners' declarations (``db.*Row.__table__``, Optuna's storage models),
read with SQLAlchemy Core selects, so no table or column name is written here twice.  The
dashboard never writes: on SQLite every connection sets ``PRAGMA query_only``, on PostgreSQL
every session is ``READ ONLY``, and no query of the dashboard is anything but a SELECT.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

from optuna.storages._rdb.models import StudyModel, TrialModel
from sqlalchemy import BigInteger, Engine, create_engine, event
from sqlalchemy.exc import NoSuchTableError, OperationalError, ProgrammingError
from sqlalchemy.pool import StaticPool

import db
from kernels import MEASUREMENT_STATUSES, OK

programs_t = db.ProgramRow.__table__
jobs_t = db.JobRow.__table__
shards_t = db.SearchShardRow.__table__
structures_t = db.StructureRow.__table__
trials_t = db.TrialRow.__table__
meas_t = db.MeasurementRow.__table__
best_t = db.BestKernelRow.__table__
models_t = db.CostModelRow.__table__
# Optuna's own tables (same database); read only for the trial states of our studies
studies_t = StudyModel.__table__
otrials_t = TrialModel.__table__

M, T, S, P = meas_t.c, trials_t.c, structures_t.c, programs_t.c

# the statuses the dashboard compares with: a measurement's are kernels' (OK, and every other
# one a failure); a job's and a search shard's are db's (checked against its lists below)
FAILURES = tuple(s for s in MEASUREMENT_STATUSES if s != OK)
FINISHED = "finished"  # a job or a search shard that ended well
RUNNING = "running"  # a job under way
if not {FINISHED, RUNNING} <= set(db.JOB_STATUSES) or FINISHED not in db.SHARD_STATUSES:
    raise ImportError("tuner.dashboard.tables: db's status names changed; follow them here")

#: what reading a table that may be absent (Optuna's, before any study) raises
MISSING_TABLE = (OperationalError, ProgrammingError, NoSuchTableError)

# measurements -> trials -> structures (-> programs): how a timing reaches its program
MEASURED = meas_t.join(trials_t, T.id == M.trial_id).join(structures_t, S.id == T.structure_id)


def shown_url(url: Any) -> str:
    """The database URL with its password masked: the only form a page or a log shows."""
    return db.normalize_url(url).render_as_string(hide_password=True)


def read_only_engine(url: Any) -> Engine:
    """An engine that cannot write, for the database at ``url`` (which must exist and be at
    the schema head: ``db.connect(..., migrate_schema=False)`` says what to run otherwise)."""
    parsed = db.normalize_url(url)
    db.connect(parsed, migrate_schema=False).close()  # SchemaError / missing file, in words
    if parsed.get_backend_name() == "sqlite":
        memory = parsed.database in (None, "", ":memory:")
        engine = create_engine(parsed, connect_args={"check_same_thread": False},
                               **({"poolclass": StaticPool} if memory else {}))

        @event.listens_for(engine, "connect")
        def _sqlite(dbapi_connection, _record) -> None:
            cur = dbapi_connection.cursor()
            cur.execute(f"PRAGMA busy_timeout={30000}")
            cur.execute("PRAGMA query_only=ON")
            cur.close()
    else:
        engine = create_engine(parsed, pool_pre_ping=True)

        @event.listens_for(engine, "connect")
        def _pg(dbapi_connection, _record) -> None:
            cur = dbapi_connection.cursor()
            cur.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
            cur.close()
            dbapi_connection.commit()
    return engine


def largest_id(engine: Engine) -> int:
    """The largest id db's key columns hold on this backend: a larger one names no row, and
    is not a query to send (PostgreSQL refuses it for an ``integer`` column)."""
    if engine.dialect.name == "sqlite":
        return 2**63 - 1
    return 2**63 - 1 if isinstance(M.id.type, BigInteger) else 2**31 - 1


def savepoint(conn: Any) -> Any:
    """A savepoint on PostgreSQL (where a failed statement spoils the transaction), nothing
    on SQLite: around a read of a table that may not be there."""
    return conn.begin_nested() if conn.dialect.name == "postgresql" else nullcontext()
