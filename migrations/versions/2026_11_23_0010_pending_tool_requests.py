"""pending tool requests: client tools and human approval

Sessions get their client tools and the tool names that need approval; a user message (stored or
waiting) may bring client tools of its own; a tool_group row records who ran it, the person's decision
and the time spent waiting for it. pending_tool_requests holds every call that waits for a client result
or a decision, with its expiry, so a suspended turn survives a restart. Every change to an existing table
is an ALTER TABLE ADD COLUMN in place.

Revision ID: 0010
Revises: 0005
Create Date: 2026-11-23 08:15:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op


revision: str = '0010'
down_revision: str | None = '0005'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'pending_tool_requests',
        sa.Column('position', sa.Integer(), nullable=False),
        sa.Column('session_id', sa.String(), nullable=False),
        sa.Column('turn_id', sqlmodel.sql.sqltypes.AutoString(length=40), nullable=False),
        sa.Column('tool_call_id', sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.Column('message_id', sqlmodel.sql.sqltypes.AutoString(length=20), nullable=False),
        sa.Column('kind', sqlmodel.sql.sqltypes.AutoString(length=10), nullable=False),
        sa.Column('tool_name', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column('arguments', sa.JSON(), nullable=True),
        sa.Column('requested_at', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column('expires_at', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column('state', sqlmodel.sql.sqltypes.AutoString(length=12), nullable=False),
        sa.Column('decision', sqlmodel.sql.sqltypes.AutoString(length=12), nullable=True),
        sa.Column('answer', sa.JSON(), nullable=True),
        sa.Column('answered_at', sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.ForeignKeyConstraint(['session_id'], ['chat_sessions.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('position'),
    )
    with op.batch_alter_table('pending_tool_requests', schema=None) as batch_op:
        batch_op.create_index('ix_pending_session_state', ['session_id', 'state'], unique=False)
        batch_op.create_index('ux_pending_turn_call', ['turn_id', 'tool_call_id'], unique=True)

    with op.batch_alter_table('chat_sessions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('client_tools', sa.JSON(), server_default=sa.text("'[]'"), nullable=False))
        batch_op.add_column(sa.Column('approval', sa.JSON(), server_default=sa.text("'[]'"), nullable=False))

    with op.batch_alter_table('chat_messages', schema=None) as batch_op:
        batch_op.add_column(sa.Column('executed_by', sqlmodel.sql.sqltypes.AutoString(length=10), nullable=True))
        batch_op.add_column(sa.Column('decision', sqlmodel.sql.sqltypes.AutoString(length=20), nullable=True))
        batch_op.add_column(sa.Column('wait_ms', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('client_tools', sa.JSON(), nullable=True))

    with op.batch_alter_table('queued_messages', schema=None) as batch_op:
        batch_op.add_column(sa.Column('client_tools', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('queued_messages', schema=None) as batch_op:
        batch_op.drop_column('client_tools')

    with op.batch_alter_table('chat_messages', schema=None) as batch_op:
        batch_op.drop_column('client_tools')
        batch_op.drop_column('wait_ms')
        batch_op.drop_column('decision')
        batch_op.drop_column('executed_by')

    with op.batch_alter_table('chat_sessions', schema=None) as batch_op:
        batch_op.drop_column('approval')
        batch_op.drop_column('client_tools')

    with op.batch_alter_table('pending_tool_requests', schema=None) as batch_op:
        batch_op.drop_index('ux_pending_turn_call')
        batch_op.drop_index('ix_pending_session_state')

    op.drop_table('pending_tool_requests')
