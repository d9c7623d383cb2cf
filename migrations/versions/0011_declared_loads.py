"""Offers declare their tasks' loads; a movement keeps its task's, which bounds what it accrues.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("offers") as batch:
        batch.add_column(sa.Column("loads", sa.JSON(), nullable=True))
    with op.batch_alter_table("movements") as batch:
        batch.add_column(sa.Column("declared_load", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("movements") as batch:
        batch.drop_column("declared_load")
    with op.batch_alter_table("offers") as batch:
        batch.drop_column("loads")
