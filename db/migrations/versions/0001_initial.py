"""Initial tuner schema: programs, jobs, search shards, structures, trials, measurements, best.

Revision ID: 0001
Revises:
Create Date: 2025-11-22

Written out in full (not imported from db._models) so that this revision stays what it was when
later revisions change the models. Constraint names are final (``op.f``), matching what the
models' naming convention produces.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)


def _pk(table: str) -> sa.PrimaryKeyConstraint:
    return sa.PrimaryKeyConstraint("id", name=op.f(f"pk_{table}"))


def _fk(table: str, column: str, target: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        [column], [f"{target}.id"], name=op.f(f"fk_{table}_{column}_{target}"), ondelete="CASCADE"
    )


def _status(table: str, values: tuple[str, ...]) -> sa.CheckConstraint:
    allowed = ", ".join(f"'{v}'" for v in values)
    return sa.CheckConstraint(f"status IN ({allowed})", name=op.f(f"ck_{table}_status"))


def upgrade() -> None:
    t = "tuner_programs"
    op.create_table(
        t,
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("program_hash", sa.String(128), nullable=False),
        sa.Column("shapes_key", sa.String(2048), nullable=False),
        sa.Column("dtype", sa.String(32), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("graph_json", sa.Text(), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        _pk(t),
        sa.UniqueConstraint("program_hash", "shapes_key", "dtype", name=op.f(f"uq_{t}_key")),
    )
    t = "tuner_jobs"
    op.create_table(
        t,
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_key", sa.String(256), nullable=False),
        sa.Column("job_path", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("started_at", _TS, nullable=False),
        sa.Column("finished_at", _TS, nullable=True),
        sa.Column("timings_json", sa.Text(), nullable=True),
        _pk(t),
        sa.UniqueConstraint("job_key", name=op.f(f"uq_{t}_key")),
        _status(t, ("running", "finished", "failed", "interrupted")),
    )
    t = "tuner_search_shards"
    op.create_table(
        t,
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("shard_key", sa.String(256), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("stats_json", sa.Text(), nullable=True),
        sa.Column("updated_at", _TS, nullable=False),
        _pk(t),
        _fk(t, "job_id", "tuner_jobs"),
        sa.UniqueConstraint("job_id", "shard_key", name=op.f(f"uq_{t}_key")),
        _status(t, ("running", "finished", "failed")),
    )
    t = "tuner_structures"
    op.create_table(
        t,
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("program_id", sa.Integer(), nullable=False),
        sa.Column("structure_hash", sa.String(128), nullable=False),
        sa.Column("structure_json", sa.Text(), nullable=False),
        sa.Column("verification_json", sa.Text(), nullable=False),
        sa.Column("num_kernels", sa.Integer(), nullable=False),
        sa.Column("bytes_moved", sa.BigInteger(), nullable=True),
        sa.Column("created_at", _TS, nullable=False),
        _pk(t),
        _fk(t, "program_id", "tuner_programs"),
        sa.UniqueConstraint("program_id", "structure_hash", name=op.f(f"uq_{t}_key")),
    )
    t = "tuner_trials"
    op.create_table(
        t,
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("structure_id", sa.Integer(), nullable=False),
        sa.Column("device_key", sa.String(256), nullable=False),
        sa.Column("config_hash", sa.String(128), nullable=False),
        sa.Column("config_json", sa.Text(), nullable=False),
        sa.Column("study_name", sa.String(256), nullable=True),
        sa.Column("trial_number", sa.Integer(), nullable=True),
        sa.Column("created_at", _TS, nullable=False),
        _pk(t),
        _fk(t, "structure_id", "tuner_structures"),
        sa.UniqueConstraint("structure_id", "device_key", "config_hash", name=op.f(f"uq_{t}_key")),
    )
    t = "tuner_measurements"
    op.create_table(
        t,
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("device_key", sa.String(256), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("median_s", sa.Double(), nullable=True),
        sa.Column("spread_s", sa.Double(), nullable=True),
        sa.Column("samples_json", sa.Text(), nullable=True),
        sa.Column("max_error", sa.Double(), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("host", sa.String(256), nullable=False),
        sa.Column("measured_at", _TS, nullable=False),
        _pk(t),
        _fk(t, "trial_id", "tuner_trials"),
        sa.UniqueConstraint("trial_id", "device_key", "attempt", name=op.f(f"uq_{t}_key")),
        _status(t, ("ok", "compile_error", "runtime_error", "timeout", "wrong_result")),
        sa.CheckConstraint(
            "status <> 'ok' OR median_s IS NOT NULL", name=op.f(f"ck_{t}_ok_has_time")
        ),
    )
    t = "tuner_best_kernels"
    op.create_table(
        t,
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("program_hash", sa.String(128), nullable=False),
        sa.Column("shapes_key", sa.String(2048), nullable=False),
        sa.Column("dtype", sa.String(32), nullable=False),
        sa.Column("device_key", sa.String(256), nullable=False),
        sa.Column("structure_id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("measurement_id", sa.Integer(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("time_s", sa.Double(), nullable=False),
        sa.Column("baseline_s", sa.Double(), nullable=True),
        sa.Column("updated_at", _TS, nullable=False),
        _pk(t),
        _fk(t, "structure_id", "tuner_structures"),
        _fk(t, "trial_id", "tuner_trials"),
        _fk(t, "measurement_id", "tuner_measurements"),
        sa.UniqueConstraint(
            "program_hash", "shapes_key", "dtype", "device_key", name=op.f(f"uq_{t}_key")
        ),
        sa.CheckConstraint("time_s > 0", name=op.f(f"ck_{t}_time_positive")),
    )


def downgrade() -> None:
    for table in (
        "tuner_best_kernels",
        "tuner_measurements",
        "tuner_trials",
        "tuner_structures",
        "tuner_search_shards",
        "tuner_jobs",
        "tuner_programs",
    ):
        op.drop_table(table)
