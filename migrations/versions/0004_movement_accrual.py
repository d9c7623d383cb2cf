"""Movements accrue payment on the load their task's host measures.

`amount` is what a movement accrued up to `accrued_at`; each host report adds the interval
since at the load it measured. Existing movements start with nothing accrued at their start.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from api.db import UTCDateTime

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("movements", schema=None) as batch_op:
        batch_op.add_column(sa.Column("amount", sa.Float(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("accrued_at", UTCDateTime(), nullable=True))
    op.execute("UPDATE movements SET accrued_at = started_at")
    with op.batch_alter_table("movements", schema=None) as batch_op:
        batch_op.alter_column("accrued_at", existing_type=UTCDateTime(), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("movements", schema=None) as batch_op:
        batch_op.drop_column("accrued_at")
        batch_op.drop_column("amount")
