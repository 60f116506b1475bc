"""a user message keeps the note its frontend gave the model (AG-UI's context)

`chat_messages.note` and `queued_messages.note`: what a frontend tells the model for the turn a user
message starts (AG-UI's `context`), joined to that turn's system prompt. Stored with the message, so a
message that waits in line on another replica, or a turn resumed after a restart, still has it; never
shown in the history. NULL for every row from before (they had none). ALTER TABLE ADD COLUMN: every row kept.

Revision ID: 0169
Revises: 0168
Create Date: 2026-11-29 08:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0169'
down_revision: str | None = '0168'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    for table in ('chat_messages', 'queued_messages'):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column('note', sa.String(), nullable=True))


def downgrade() -> None:
    for table in ('queued_messages', 'chat_messages'):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column('note')
