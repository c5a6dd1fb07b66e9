"""Best kernels that may not be the fastest: ``tuner_best_kernels.uncertain`` says why (its
timings were noisy or taken on a loaded machine, the runner-up within the noise), NULL when
the finalists' interleaved re-timings separate the best from the rest.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_TABLE = "tuner_best_kernels"


def upgrade() -> None:
    with op.batch_alter_table(_TABLE) as batch:
        batch.add_column(sa.Column("uncertain", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table(_TABLE) as batch:
        batch.drop_column("uncertain")
