"""Measurement status ``node_lost``: a trial whose Ray node (and slot) died under it and could
not be re-run elsewhere is stored as such, never dropped (docs/cluster.md).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23

Written out in full, as 0001 and 0002: the allowed statuses are listed here, not imported.
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_TABLE = "tuner_measurements"
_OLD = ("ok", "compile_error", "runtime_error", "timeout", "wrong_result")
_NEW = (*_OLD, "node_lost")


def _swap(values: tuple[str, ...]) -> None:
    allowed = ", ".join(f"'{v}'" for v in values)
    with op.batch_alter_table(_TABLE, recreate="auto") as batch:
        batch.drop_constraint(op.f(f"ck_{_TABLE}_status"), type_="check")
        batch.create_check_constraint(op.f(f"ck_{_TABLE}_status"), f"status IN ({allowed})")


def upgrade() -> None:
    _swap(_NEW)


def downgrade() -> None:
    op.execute(f"DELETE FROM {_TABLE} WHERE status = 'node_lost'")
    _swap(_OLD)
