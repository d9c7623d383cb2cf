"""High availability records: replicas and failovers.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_LIVE = "state != 'dropped'"


def upgrade() -> None:
    op.create_table(
        "replicas",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("participant_id", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(length=32), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=True),
        sa.Column("synced_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("bytes_copied", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["participant_id"], ["participants.id"]),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("replicas", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_replicas_participant_id"), ["participant_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_replicas_state"), ["state"], unique=False)
        batch_op.create_index(batch_op.f("ix_replicas_task_id"), ["task_id"], unique=False)
        batch_op.create_index(
            "uq_replicas_task_holder",
            ["task_id", "participant_id"],
            unique=True,
            sqlite_where=sa.text(_LIVE),
            postgresql_where=sa.text(_LIVE),
        )

    op.create_table(
        "failovers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("mode", sa.String(length=32), nullable=False),
        sa.Column("failed_id", sa.Integer(), nullable=True),
        sa.Column("from_host_id", sa.Integer(), nullable=False),
        sa.Column("to_host_id", sa.Integer(), nullable=False),
        sa.Column("from_epoch", sa.Integer(), nullable=False),
        sa.Column("to_epoch", sa.Integer(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("detected_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("recovery_s", sa.Float(), nullable=True),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["failed_id"], ["participants.id"]),
        sa.ForeignKeyConstraint(["from_host_id"], ["participants.id"]),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"]),
        sa.ForeignKeyConstraint(["to_host_id"], ["participants.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("failovers", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_failovers_task_id"), ["task_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("failovers", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_failovers_task_id"))
    op.drop_table("failovers")
    with op.batch_alter_table("replicas", schema=None) as batch_op:
        batch_op.drop_index("uq_replicas_task_holder", sqlite_where=sa.text(_LIVE), postgresql_where=sa.text(_LIVE))
        batch_op.drop_index(batch_op.f("ix_replicas_task_id"))
        batch_op.drop_index(batch_op.f("ix_replicas_state"))
        batch_op.drop_index(batch_op.f("ix_replicas_participant_id"))
    op.drop_table("replicas")
