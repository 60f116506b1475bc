"""tool rows record who ran the tool and whether its result was cut

A tool_group chat message gets `source` (builtin, mcp, http, client) and `truncated`. Rows from before
are built-in calls; they keep NULL, which the history reads as unknown source and not truncated. Both
are ALTER TABLE ADD COLUMN in place: no table is copied.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 08:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op


revision: str = '0005'
down_revision: str | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('chat_messages', schema=None) as batch_op:
        batch_op.add_column(sa.Column('source', sqlmodel.sql.sqltypes.AutoString(length=20), nullable=True))
        batch_op.add_column(sa.Column('truncated', sa.Boolean(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('chat_messages', schema=None) as batch_op:
        batch_op.drop_column('truncated')
        batch_op.drop_column('source')
