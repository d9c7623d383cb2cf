"""An accepted offer keeps the offerer's cap (`price`) and records the settled price apart.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("offers") as batch:
        batch.add_column(sa.Column("settled_price", sa.Float(), nullable=True))
    # Offers accepted before carried only the settled price, in `price`.
    op.execute("UPDATE offers SET settled_price = price WHERE state = 'accepted'")


def downgrade() -> None:
    op.execute("UPDATE offers SET price = settled_price WHERE settled_price IS NOT NULL")
    with op.batch_alter_table("offers") as batch:
        batch.drop_column("settled_price")
