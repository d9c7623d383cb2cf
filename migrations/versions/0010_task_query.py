"""The query a task runs and the digest of its definition (`bpm.query`).

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("query", sa.String(64), nullable=True))
        batch.add_column(sa.Column("query_digest", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("query_digest")
        batch.drop_column("query")
