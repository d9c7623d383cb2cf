"""A participant registers the TLS certificate its agent serves; partners pin it.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("participants") as batch:
        batch.add_column(sa.Column("certificate", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("participants") as batch:
        batch.drop_column("certificate")
