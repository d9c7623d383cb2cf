"""Contracts indexed by their parties: a heartbeat reads its participant's partners by them.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_contracts_proposer_id", "contracts", ["proposer_id"])
    op.create_index("ix_contracts_counterparty_id", "contracts", ["counterparty_id"])


def downgrade() -> None:
    op.drop_index("ix_contracts_counterparty_id", table_name="contracts")
    op.drop_index("ix_contracts_proposer_id", table_name="contracts")
