"""An offer carries the offerer's cap for each leading part of its tasks (`caps`), and an
accepted offer keeps the offerer's cap (`price`) and records the settled price apart.

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
    # Plain ADD COLUMN, not a batch (table copy): SQLite would refuse to drop `offers`,
    # which movements reference.
    op.add_column("offers", sa.Column("settled_price", sa.Float(), nullable=True))
    op.add_column("offers", sa.Column("caps", sa.JSON(), nullable=True))
    # Offers made before carried one price, the cap for every part; those accepted before
    # carried only the settled price, in `price`.
    offers = sa.table("offers", sa.column("id", sa.Integer), sa.column("task_ids", sa.JSON), sa.column("price", sa.Float), sa.column("caps", sa.JSON))
    connection = op.get_bind()
    for offer_id, task_ids, price in connection.execute(sa.select(offers.c.id, offers.c.task_ids, offers.c.price)).all():
        connection.execute(offers.update().where(offers.c.id == offer_id).values(caps=[price] * len(task_ids)))
    op.execute("UPDATE offers SET settled_price = price WHERE state = 'accepted'")
    if connection.dialect.name != "sqlite":  # SQLite cannot add NOT NULL to a column in place
        op.alter_column("offers", "caps", existing_type=sa.JSON(), nullable=False)


def downgrade() -> None:
    op.execute("UPDATE offers SET price = settled_price WHERE settled_price IS NOT NULL")
    op.drop_column("offers", "caps")
    op.drop_column("offers", "settled_price")
