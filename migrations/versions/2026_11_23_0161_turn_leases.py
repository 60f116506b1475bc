"""turn leases: which replica runs a turn, with a fencing token

Multi-replica mode: a replica claims a session's turn in the transaction that starts it, renews the
claim on a heartbeat, and every write of the turn checks the token. The unique partial index allows one
running turn per session.

Revision ID: 0161
Revises: 0160
Create Date: 2026-11-23 11:35:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op


revision: str = '0161'
down_revision: str | None = '0160'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'turn_leases',
        sa.Column('turn_id', sqlmodel.sql.sqltypes.AutoString(length=40), nullable=False),
        sa.Column('session_id', sa.String(), nullable=False),
        sa.Column('owner', sqlmodel.sql.sqltypes.AutoString(length=100), nullable=False),
        sa.Column('token', sa.BigInteger(), nullable=False),
        sa.Column('expires_at', sa.Float(), nullable=False),
        sa.Column('state', sqlmodel.sql.sqltypes.AutoString(length=10), nullable=False),
        sa.Column('cancel_requested', sa.Boolean(), server_default=sa.text('false'), nullable=False),
        sa.ForeignKeyConstraint(['session_id'], ['chat_sessions.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('turn_id'),
    )
    with op.batch_alter_table('turn_leases', schema=None) as batch_op:
        batch_op.create_index('ix_turn_leases_state_expires', ['state', 'expires_at'], unique=False)
        batch_op.create_index(
            'ux_turn_leases_running',
            ['session_id'],
            unique=True,
            sqlite_where=sa.text("state = 'running'"),
            postgresql_where=sa.text("state = 'running'"),
        )


def downgrade() -> None:
    with op.batch_alter_table('turn_leases', schema=None) as batch_op:
        batch_op.drop_index('ux_turn_leases_running')
        batch_op.drop_index('ix_turn_leases_state_expires')
    op.drop_table('turn_leases')
