"""SQLAlchemy 2 models of the tuner database.

Every table is prefixed ``tuner_`` because Optuna's RDB storage lives in the same database and
already owns ``studies``, ``trials``, ``trial_params``... Every table that a retried task could
write twice has a natural unique key; the write helpers insert with ON CONFLICT DO NOTHING on
that key, which is what makes writes idempotent. Changing anything here needs a new migration
in ``db/migrations/versions`` (``tests/db/test_db.py`` fails when models and migrations drift).
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Double,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# the trial statuses are kernels' (its devices produce them): the one import of db from another
# package of ours, a leaf that imports nothing (kernels/devices/_status.py)
from kernels import MEASUREMENT_STATUSES, OK

#: Table-name prefix shared by every table this package owns.
PREFIX = "tuner_"
#: Alembic's version table for our migrations; Optuna keeps its own ``alembic_version``.
VERSION_TABLE = "tuner_alembic_version"

JOB_STATUSES = ("running", "finished", "failed", "interrupted")
SHARD_STATUSES = ("running", "finished", "failed")

# Lengths of key columns: bounded so that they fit in a PostgreSQL b-tree index entry.
HASH_LEN = 128
KEY_LEN = 256
SHAPES_LEN = 2048
DTYPE_LEN = 32

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(constraint_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    """Timezone-aware now; all stored times are UTC."""
    return datetime.now(timezone.utc)


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class ProgramRow(Base):
    """A reference program at given shapes and dtype (the unit a best kernel answers for)."""

    __tablename__ = "tuner_programs"
    __table_args__ = (UniqueConstraint("program_hash", "shapes_key", "dtype", name="key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    program_hash: Mapped[str] = mapped_column(String(HASH_LEN))
    shapes_key: Mapped[str] = mapped_column(String(SHAPES_LEN))
    dtype: Mapped[str] = mapped_column(String(DTYPE_LEN))
    name: Mapped[str] = mapped_column(String(KEY_LEN))
    graph_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class JobRow(Base):
    """One job file run against this database; ``job_key`` identifies it across relaunches."""

    __tablename__ = "tuner_jobs"
    __table_args__ = (
        UniqueConstraint("job_key", name="key"),
        CheckConstraint(_in("status", JOB_STATUSES), name="status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_key: Mapped[str] = mapped_column(String(KEY_LEN))
    job_path: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=1)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    timings_json: Mapped[str | None] = mapped_column(Text)


class SearchShardRow(Base):
    """Progress of one search shard of a job, so that a resumed job skips finished shards."""

    __tablename__ = "tuner_search_shards"
    __table_args__ = (
        UniqueConstraint("job_id", "shard_key", name="key"),
        CheckConstraint(_in("status", SHARD_STATUSES), name="status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("tuner_jobs.id", ondelete="CASCADE"))
    shard_key: Mapped[str] = mapped_column(String(KEY_LEN))
    status: Mapped[str] = mapped_column(String(16))
    stats_json: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class StructureRow(Base):
    """A verified µGraph structure (symbolic tiling) found for a program."""

    __tablename__ = "tuner_structures"
    __table_args__ = (UniqueConstraint("program_id", "structure_hash", name="key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    program_id: Mapped[int] = mapped_column(ForeignKey("tuner_programs.id", ondelete="CASCADE"))
    structure_hash: Mapped[str] = mapped_column(String(HASH_LEN))
    structure_json: Mapped[str] = mapped_column(Text)
    verification_json: Mapped[str] = mapped_column(Text)
    num_kernels: Mapped[int] = mapped_column(Integer)
    bytes_moved: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class TrialRow(Base):
    """A config (binding of a structure's symbols) to be measured on one device key."""

    __tablename__ = "tuner_trials"
    __table_args__ = (UniqueConstraint("structure_id", "device_key", "config_hash", name="key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    structure_id: Mapped[int] = mapped_column(ForeignKey("tuner_structures.id", ondelete="CASCADE"))
    device_key: Mapped[str] = mapped_column(String(KEY_LEN))
    config_hash: Mapped[str] = mapped_column(String(HASH_LEN))
    config_json: Mapped[str] = mapped_column(Text)
    study_name: Mapped[str | None] = mapped_column(String(KEY_LEN))
    trial_number: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class MeasurementRow(Base):
    """One timed run of a trial; ``attempt`` separates deliberate re-measurements from retries."""

    __tablename__ = "tuner_measurements"
    __table_args__ = (
        UniqueConstraint("trial_id", "device_key", "attempt", name="key"),
        CheckConstraint(_in("status", MEASUREMENT_STATUSES), name="status"),
        CheckConstraint(f"status <> '{OK}' OR median_s IS NOT NULL", name="ok_has_time"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("tuner_trials.id", ondelete="CASCADE"))
    device_key: Mapped[str] = mapped_column(String(KEY_LEN))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    status: Mapped[str] = mapped_column(String(16))
    median_s: Mapped[float | None] = mapped_column(Double)
    spread_s: Mapped[float | None] = mapped_column(Double)
    samples_json: Mapped[str | None] = mapped_column(Text)
    max_error: Mapped[float | None] = mapped_column(Double)
    message: Mapped[str | None] = mapped_column(Text)
    host: Mapped[str] = mapped_column(String(KEY_LEN))
    measured_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class BestKernelRow(Base):
    """The fastest passing kernel per program × shapes × dtype × device key."""

    __tablename__ = "tuner_best_kernels"
    __table_args__ = (
        UniqueConstraint("program_hash", "shapes_key", "dtype", "device_key", name="key"),
        CheckConstraint("time_s > 0", name="time_positive"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    program_hash: Mapped[str] = mapped_column(String(HASH_LEN))
    shapes_key: Mapped[str] = mapped_column(String(SHAPES_LEN))
    dtype: Mapped[str] = mapped_column(String(DTYPE_LEN))
    device_key: Mapped[str] = mapped_column(String(KEY_LEN))
    structure_id: Mapped[int] = mapped_column(ForeignKey("tuner_structures.id", ondelete="CASCADE"))
    trial_id: Mapped[int] = mapped_column(ForeignKey("tuner_trials.id", ondelete="CASCADE"))
    measurement_id: Mapped[int] = mapped_column(
        ForeignKey("tuner_measurements.id", ondelete="CASCADE")
    )
    source: Mapped[str] = mapped_column(Text)
    time_s: Mapped[float] = mapped_column(Double)
    baseline_s: Mapped[float | None] = mapped_column(Double)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # why the best is not certain (its timings were noisy, the machine loaded, the runner-up
    # within the noise); NULL: the finalists' timings separate it from the rest
    uncertain: Mapped[str | None] = mapped_column(Text, default=None)
