"""a session's turns form a tree: each turn_start names its parent turn, each session its active head

`chat_messages.parent_turn_id` (set on turn_start rows) and `chat_sessions.head_turn_id`. Existing sessions
become single-path trees: each turn's parent is the turn before it in the session's history, and the head
is the session's last turn. Nothing else changes: no row is copied or renumbered. ALTER TABLE ADD COLUMN in
place, then two UPDATEs with correlated subqueries both dialects run alike.

Revision ID: 0163
Revises: 0162
Create Date: 2026-11-29 04:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0163'
down_revision: str | None = '0162'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('chat_messages', schema=None) as batch_op:
        batch_op.add_column(sa.Column('parent_turn_id', sa.String(length=40), nullable=True))
    with op.batch_alter_table('chat_sessions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('head_turn_id', sa.String(length=40), nullable=True))
    op.execute(
        "UPDATE chat_messages SET parent_turn_id = ("
        " SELECT p.turn_id FROM chat_messages p"
        " WHERE p.session_id = chat_messages.session_id AND p.type = 'turn_start'"
        " AND p.position < chat_messages.position ORDER BY p.position DESC LIMIT 1"
        ") WHERE type = 'turn_start'"
    )
    op.execute(
        "UPDATE chat_sessions SET head_turn_id = ("
        " SELECT m.turn_id FROM chat_messages m"
        " WHERE m.session_id = chat_sessions.id AND m.type = 'turn_start'"
        " ORDER BY m.position DESC LIMIT 1"
        ")"
    )


def downgrade() -> None:
    with op.batch_alter_table('chat_sessions', schema=None) as batch_op:
        batch_op.drop_column('head_turn_id')
    with op.batch_alter_table('chat_messages', schema=None) as batch_op:
        batch_op.drop_column('parent_turn_id')
