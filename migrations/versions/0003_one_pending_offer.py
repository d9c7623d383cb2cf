"""One pending offer per participant, enforced by the database.

Offers past their expiry were left 'pending' and shown as expired; they are now stored as
'expired' before a participant makes a new offer, so a partial unique index can hold the
rule under concurrent requests. Pending offers left over from before (a race could leave
several) are expired, all but each participant's newest.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_PENDING = "state = 'pending'"


def upgrade() -> None:
    op.execute(
        "UPDATE offers SET state = 'expired' WHERE state = 'pending' AND id NOT IN "
        "(SELECT newest FROM (SELECT max(id) AS newest FROM offers WHERE state = 'pending' GROUP BY from_id) AS kept)"
    )
    with op.batch_alter_table("offers", schema=None) as batch_op:
        batch_op.create_index(
            "uq_offers_one_pending",
            ["from_id"],
            unique=True,
            sqlite_where=sa.text(_PENDING),
            postgresql_where=sa.text(_PENDING),
        )


def downgrade() -> None:
    with op.batch_alter_table("offers", schema=None) as batch_op:
        batch_op.drop_index("uq_offers_one_pending", sqlite_where=sa.text(_PENDING), postgresql_where=sa.text(_PENDING))
