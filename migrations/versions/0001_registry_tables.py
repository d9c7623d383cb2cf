"""Registry tables: participants, contracts, tasks, offers, movements, events, load samples.

Revision ID: 0001
Revises:
Create Date: 2026-11-21 05:38:50.376408
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op



revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('events',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('kind', sa.String(length=64), nullable=False),
    sa.Column('actor', sa.String(length=64), nullable=True),
    sa.Column('subject', sa.String(length=64), nullable=True),
    sa.Column('message', sa.Text(), nullable=False),
    sa.Column('data', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_events_actor'), ['actor'], unique=False)
        batch_op.create_index(batch_op.f('ix_events_at'), ['at'], unique=False)
        batch_op.create_index(batch_op.f('ix_events_kind'), ['kind'], unique=False)
        batch_op.create_index(batch_op.f('ix_events_subject'), ['subject'], unique=False)

    op.create_table('participants',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('endpoint', sa.String(length=512), nullable=False),
    sa.Column('key_hash', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('load', sa.Float(), nullable=True),
    sa.Column('threshold', sa.Float(), nullable=True),
    sa.Column('marginal_cost', sa.JSON(), nullable=True),
    sa.Column('report', sa.JSON(), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('key_hash'),
    sa.UniqueConstraint('name')
    )
    op.create_table('contracts',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('proposer_id', sa.Integer(), nullable=False),
    sa.Column('counterparty_id', sa.Integer(), nullable=False),
    sa.Column('last_proposed_by_id', sa.Integer(), nullable=False),
    sa.Column('pair_lo', sa.Integer(), nullable=False),
    sa.Column('pair_hi', sa.Integer(), nullable=False),
    sa.Column('price_min', sa.Float(), nullable=False),
    sa.Column('price_max', sa.Float(), nullable=False),
    sa.Column('min_duration_s', sa.Float(), nullable=False),
    sa.Column('valid_until', sa.DateTime(timezone=True), nullable=True),
    sa.Column('ha_mode', sa.String(length=32), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['counterparty_id'], ['participants.id'], ),
    sa.ForeignKeyConstraint(['last_proposed_by_id'], ['participants.id'], ),
    sa.ForeignKeyConstraint(['proposer_id'], ['participants.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('contracts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_contracts_state'), ['state'], unique=False)
        batch_op.create_index('uq_contracts_active_pair', ['pair_lo', 'pair_hi'], unique=True, sqlite_where=sa.text("state = 'active'"), postgresql_where=sa.text("state = 'active'"))

    op.create_table('load_samples',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('participant_id', sa.Integer(), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('load', sa.Float(), nullable=False),
    sa.Column('threshold', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['participant_id'], ['participants.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('load_samples', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_load_samples_at'), ['at'], unique=False)
        batch_op.create_index(batch_op.f('ix_load_samples_participant_id'), ['participant_id'], unique=False)

    op.create_table('tasks',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('origin_id', sa.Integer(), nullable=False),
    sa.Column('host_id', sa.Integer(), nullable=False),
    sa.Column('load', sa.Float(), nullable=False),
    sa.Column('input_uri', sa.String(length=1024), nullable=True),
    sa.Column('params', sa.JSON(), nullable=False),
    sa.Column('ha_mode', sa.String(length=32), nullable=False),
    sa.Column('epoch', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['host_id'], ['participants.id'], ),
    sa.ForeignKeyConstraint(['origin_id'], ['participants.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('origin_id', 'name', name='uq_tasks_origin_name')
    )
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_tasks_host_id'), ['host_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_tasks_origin_id'), ['origin_id'], unique=False)

    op.create_table('offers',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('contract_id', sa.Integer(), nullable=False),
    sa.Column('from_id', sa.Integer(), nullable=False),
    sa.Column('to_id', sa.Integer(), nullable=False),
    sa.Column('task_ids', sa.JSON(), nullable=False),
    sa.Column('accepted_task_ids', sa.JSON(), nullable=True),
    sa.Column('price', sa.Float(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('decided_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['contract_id'], ['contracts.id'], ),
    sa.ForeignKeyConstraint(['from_id'], ['participants.id'], ),
    sa.ForeignKeyConstraint(['to_id'], ['participants.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('offers', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_offers_contract_id'), ['contract_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_offers_from_id'), ['from_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_offers_state'), ['state'], unique=False)
        batch_op.create_index(batch_op.f('ix_offers_to_id'), ['to_id'], unique=False)

    op.create_table('movements',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('offer_id', sa.Integer(), nullable=False),
    sa.Column('contract_id', sa.Integer(), nullable=False),
    sa.Column('task_id', sa.Integer(), nullable=False),
    sa.Column('from_id', sa.Integer(), nullable=False),
    sa.Column('to_id', sa.Integer(), nullable=False),
    sa.Column('price', sa.Float(), nullable=False),
    sa.Column('load', sa.Float(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('earliest_end_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('ended_by_id', sa.Integer(), nullable=True),
    sa.ForeignKeyConstraint(['contract_id'], ['contracts.id'], ),
    sa.ForeignKeyConstraint(['ended_by_id'], ['participants.id'], ),
    sa.ForeignKeyConstraint(['from_id'], ['participants.id'], ),
    sa.ForeignKeyConstraint(['offer_id'], ['offers.id'], ),
    sa.ForeignKeyConstraint(['task_id'], ['tasks.id'], ),
    sa.ForeignKeyConstraint(['to_id'], ['participants.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('movements', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_movements_contract_id'), ['contract_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_movements_from_id'), ['from_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_movements_offer_id'), ['offer_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_movements_state'), ['state'], unique=False)
        batch_op.create_index(batch_op.f('ix_movements_task_id'), ['task_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_movements_to_id'), ['to_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('movements', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_movements_to_id'))
        batch_op.drop_index(batch_op.f('ix_movements_task_id'))
        batch_op.drop_index(batch_op.f('ix_movements_state'))
        batch_op.drop_index(batch_op.f('ix_movements_offer_id'))
        batch_op.drop_index(batch_op.f('ix_movements_from_id'))
        batch_op.drop_index(batch_op.f('ix_movements_contract_id'))

    op.drop_table('movements')
    with op.batch_alter_table('offers', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_offers_to_id'))
        batch_op.drop_index(batch_op.f('ix_offers_state'))
        batch_op.drop_index(batch_op.f('ix_offers_from_id'))
        batch_op.drop_index(batch_op.f('ix_offers_contract_id'))

    op.drop_table('offers')
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_tasks_origin_id'))
        batch_op.drop_index(batch_op.f('ix_tasks_host_id'))

    op.drop_table('tasks')
    with op.batch_alter_table('load_samples', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_load_samples_participant_id'))
        batch_op.drop_index(batch_op.f('ix_load_samples_at'))

    op.drop_table('load_samples')
    with op.batch_alter_table('contracts', schema=None) as batch_op:
        batch_op.drop_index('uq_contracts_active_pair', sqlite_where=sa.text("state = 'active'"), postgresql_where=sa.text("state = 'active'"))
        batch_op.drop_index(batch_op.f('ix_contracts_state'))

    op.drop_table('contracts')
    op.drop_table('participants')
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_events_subject'))
        batch_op.drop_index(batch_op.f('ix_events_kind'))
        batch_op.drop_index(batch_op.f('ix_events_at'))
        batch_op.drop_index(batch_op.f('ix_events_actor'))

    op.drop_table('events')
