"""event counter: chat_sessions.last_seq

The last event number taken for the session, for several replicas logging one session's events: each
logging transaction takes its numbers with UPDATE ... SET last_seq = last_seq + n RETURNING last_seq,
whose row lock serializes them across processes. Filled from the log, so a database that ran in
single-process mode goes on from its last number.

Revision ID: 0160
Revises: 0010
Create Date: 2026-11-23 11:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0160'
down_revision: str | None = '0010'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('chat_sessions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('last_seq', sa.Integer(), server_default=sa.text('0'), nullable=False))
    op.execute(
        "UPDATE chat_sessions SET last_seq = COALESCE("
        "(SELECT max(seq) FROM events WHERE events.session_id = chat_sessions.id), 0)"
    )


def downgrade() -> None:
    with op.batch_alter_table('chat_sessions', schema=None) as batch_op:
        batch_op.drop_column('last_seq')
