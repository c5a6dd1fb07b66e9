"""The tuner database: programs, jobs, structures, trials, measurements and best kernels.

Small public face (other packages use only this)::

    database = db.connect("sqlite:///./tuner.db")   # or postgresql+psycopg://...
    pid = database.record_program(hash, shapes, "float32", "rmsnorm_matmul", graph_json)
    best = database.best_kernel(hash, shapes, "float32", device_key="cpu:x86_64")

A new database is created at the current schema head; writes are idempotent on natural keys,
so a retried task never duplicates a row. See docs/database.md.

Inside, private modules: ``_engine`` (URL → configured engine), ``_models`` (the ORM rows,
named ``*Row``), ``_records`` (the plain values queries return, errors, canonical keys),
``_queries`` (reads), ``_writes`` (sessions and the idempotent writes), ``_bulk`` (a batch of
trials and their measurements in one transaction), ``_store`` (the
``Database`` handle, which has both), ``_learning`` (cost models and their training rows) and
``_migrate`` (the packaged Alembic migrations in ``migrations/``, and the schema lock).
"""

from __future__ import annotations

from sqlalchemy.engine import URL

from db import _migrate
from db._bulk import record_trials
from db._engine import DEFAULT_URL, make_engine, normalize_url, sqlite_file
from db._learning import (
    ALL_DEVICES,
    CostModelRow,
    DatasetRow,
    MeasuredConfig,
    ModelRecord,
    TrainingRow,
    best_model,
    dataset_rows,
    measured_structures,
    models,
    newest_measurement_id,
    record_measured_space,
    save_model,
    structure_configs,
    training_rows,
    with_weights,
)
from db._models import (
    JOB_STATUSES,
    MEASUREMENT_STATUSES,
    SHARD_STATUSES,
    VERSION_TABLE,
    Base,
    BestKernelRow,
    JobRow,
    MeasurementRow,
    ProgramRow,
    SearchShardRow,
    StructureRow,
    TrialRow,
)
from db._records import (
    LIBRARY_PREFIX,
    BestKernel,
    DatabaseError,
    HistoryEntry,
    JobRecord,
    MeasurementRecord,
    MissingDriverError,
    ProgramSummary,
    SchemaError,
    StructureRecord,
    config_hash,
    shapes_key,
)
from db._store import Database

__all__ = [
    "ALL_DEVICES",
    "DEFAULT_URL",
    "JOB_STATUSES",
    "LIBRARY_PREFIX",
    "MEASUREMENT_STATUSES",
    "SHARD_STATUSES",
    "VERSION_TABLE",
    "Base",
    "BestKernel",
    "BestKernelRow",
    "CostModelRow",
    "DatasetRow",
    "Database",
    "DatabaseError",
    "HistoryEntry",
    "JobRecord",
    "JobRow",
    "MeasuredConfig",
    "MeasurementRecord",
    "MeasurementRow",
    "MissingDriverError",
    "ModelRecord",
    "ProgramRow",
    "ProgramSummary",
    "SchemaError",
    "SearchShardRow",
    "StructureRecord",
    "StructureRow",
    "TrainingRow",
    "TrialRow",
    "best_model",
    "dataset_rows",
    "config_hash",
    "connect",
    "current_revision",
    "head_revision",
    "measured_structures",
    "models",
    "newest_measurement_id",
    "normalize_url",
    "record_measured_space",
    "record_trials",
    "save_model",
    "with_weights",
    "shapes_key",
    "sqlite_file",
    "structure_configs",
    "training_rows",
    "upgrade",
]


def connect(url: str | URL | None = None, *, migrate_schema: bool = True) -> Database:
    """Open the database at ``url`` (default ``sqlite:///./tuner.db``).

    With ``migrate_schema`` (the default) a new database is created at the current head and an
    older one is upgraded. Without it nothing is created or changed: a missing SQLite file, a
    database without tuner tables, or one at another revision raises ``SchemaError`` saying
    to run ``tuner db upgrade`` — the mode for read-only commands such as ``tuner best``.
    """
    parsed = normalize_url(url)
    if not migrate_schema and parsed.get_backend_name() == "sqlite":
        path = sqlite_file(parsed)
        if path is not None and not path.exists():
            raise SchemaError(
                f"no database at {str(path)!r}: run `tuner launch JOB.yaml` to create one"
                " (or `tuner db upgrade --db URL` for an empty one)"
            )
    database = Database(make_engine(parsed))
    try:
        if migrate_schema:
            database.upgrade()
        else:
            _check_head(database)
    except BaseException:
        database.close()
        raise
    return database


def _check_head(database: Database) -> None:
    current, head = database.current_revision(), _migrate.head_revision()
    if current == head:
        return
    shown = database.engine.url.render_as_string(hide_password=True)
    if current is None:
        raise SchemaError(f"{shown} has no tuner tables: run `tuner db upgrade --db {shown}`")
    raise SchemaError(
        f"{shown} is at tuner schema revision {current!r}, this code needs {head!r}:"
        f" run `tuner db upgrade --db {shown}`"
    )


def upgrade(url: str | URL | None = None, revision: str = "head") -> str | None:
    """Create or upgrade the tuner tables at ``url``; returns the revision now current."""
    with Database(make_engine(normalize_url(url))) as database:
        return database.upgrade(revision)


def current_revision(url: str | URL | None = None) -> str | None:
    """The tuner schema revision of the database at ``url`` (None: no tuner tables)."""
    with Database(make_engine(normalize_url(url))) as database:
        return database.current_revision()


def head_revision() -> str:
    """The newest schema revision this code knows."""
    return _migrate.head_revision()
