"""Failovers indexed by the participants they name: a participant's view reads its failovers by them.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

COLUMNS = ("failed_id", "from_host_id", "to_host_id")


def upgrade() -> None:
    for column in COLUMNS:
        op.create_index(f"ix_failovers_{column}", "failovers", [column])


def downgrade() -> None:
    for column in COLUMNS:
        op.drop_index(f"ix_failovers_{column}", table_name="failovers")
