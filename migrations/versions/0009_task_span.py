"""A task's span of event time: where a split or merge made it start, where it handed its
key groups over, and when its origin retired it.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from api.db import UTCDateTime

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("since_s", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("until_s", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("retired_at", UTCDateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("retired_at")
        batch.drop_column("until_s")
        batch.drop_column("since_s")
