"""Task lineage: which task a split or merge made came from.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "task_lineage",
        sa.Column("child_id", sa.Integer(), sa.ForeignKey("tasks.id"), primary_key=True),
        sa.Column("parent_id", sa.Integer(), sa.ForeignKey("tasks.id"), primary_key=True),
        sa.Column("groups", sa.String(8), nullable=False),
        sa.UniqueConstraint("parent_id", "groups", name="uq_task_lineage_parent_groups"),
    )
    op.create_index("ix_task_lineage_parent_id", "task_lineage", ["parent_id"])


def downgrade() -> None:
    op.drop_index("ix_task_lineage_parent_id", table_name="task_lineage")
    op.drop_table("task_lineage")
