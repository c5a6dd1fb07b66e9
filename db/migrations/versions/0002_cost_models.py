"""Trained cost models: ``tuner_models`` (weights, feature version, training rows, metrics).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23

Written out in full, as 0001, so that it stays what it was when the models change later.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    t = "tuner_models"
    op.create_table(
        t,
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("device_key", sa.String(256), nullable=False),
        sa.Column("feature_version", sa.Integer(), nullable=False),
        sa.Column("weights", sa.LargeBinary(), nullable=False),
        sa.Column("trained_on_json", sa.Text(), nullable=False),
        sa.Column("metrics_json", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f(f"pk_{t}")),
    )


def downgrade() -> None:
    op.drop_table("tuner_models")
