"""The change-feed streams a key holds open, counted in the database by every worker of the registry.

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "feed_stream_slots",
        sa.Column("key_id", sa.String(64), primary_key=True),
        sa.Column("slot", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("holder", sa.String(32), nullable=False),
        sa.Column("until", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("feed_stream_slots")
