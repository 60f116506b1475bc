"""a frontend kit's chat or thread id finds its session again

`chat_bindings` holds, per principal and kit (`ai-sdk`, `ag-ui`), the session a kit's own chat id (the
AI SDK's chat `id`, AG-UI's `threadId`) names. The id is kept as its SHA-256 (`chat_key`), so any id a kit
makes fits the key; two first requests with one new id race on the primary key (INSERT ... ON CONFLICT DO
NOTHING), and both read the one binding that won. A new table: no existing row is touched.

Revision ID: 0167
Revises: 0166
Create Date: 2026-11-29 04:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0167'
down_revision: str | None = '0166'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'chat_bindings',
        sa.Column('principal', sa.String(length=100), nullable=False),
        sa.Column('kit', sa.String(length=10), nullable=False),
        sa.Column('chat_key', sa.String(length=64), nullable=False),
        sa.Column(
            'session_id', sa.String(), sa.ForeignKey('chat_sessions.id', ondelete='CASCADE'), nullable=False
        ),
        sa.Column('created_at', sa.String(), nullable=False),
        sa.PrimaryKeyConstraint('principal', 'kit', 'chat_key'),
    )
    op.create_index('ix_chat_bindings_session', 'chat_bindings', ['session_id'])


def downgrade() -> None:
    op.drop_index('ix_chat_bindings_session', table_name='chat_bindings')
    op.drop_table('chat_bindings')
