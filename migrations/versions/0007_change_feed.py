"""The change feed: a notice per participant concerned by a change of a task, an offer or a
contract, kept until that participant's agent acknowledges it.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "changes",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("participant_id", sa.Integer(), sa.ForeignKey("participants.id"), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
    )
    op.create_index("ix_changes_participant_id_id", "changes", ["participant_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_changes_participant_id_id", table_name="changes")
    op.drop_table("changes")
