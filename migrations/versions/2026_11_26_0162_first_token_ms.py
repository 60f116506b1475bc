"""an assistant text records its response's wait for the first token

A text chat message gets `first_token_ms`: from the model request to the response's first token (its
`duration_ms` runs from the same request to the response's end). Rows from before keep NULL, which the
history shows as unknown. ALTER TABLE ADD COLUMN in place: no table is copied.

Revision ID: 0162
Revises: 0161
Create Date: 2026-11-26 19:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0162'
down_revision: str | None = '0161'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('chat_messages', schema=None) as batch_op:
        batch_op.add_column(sa.Column('first_token_ms', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('chat_messages', schema=None) as batch_op:
        batch_op.drop_column('first_token_ms')
