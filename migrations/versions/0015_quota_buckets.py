"""Quotas' token buckets in the database, shared by every worker of the registry.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "quota_buckets",
        sa.Column("action", sa.String(16), primary_key=True),
        sa.Column("who", sa.String(128), primary_key=True),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("quota_buckets")
