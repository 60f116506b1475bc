"""sessions carry the product's metadata; the service keeps its own shared secrets

`chat_sessions.session_metadata`: the session's `metadata` (a JSON object, '{}' for the rows from before).
`session_metadata`: one row per top-level entry, the value as the text the session list's filter compares
(`GET /v1/sessions?metadata.<key>=<value>`), indexed on (key, value). `service_secrets`: secrets the
service makes for itself and every replica shares (the stream tokens' signing secret). Existing rows are
kept as they are: ALTER TABLE ADD COLUMN with a default, and two new tables.

Revision ID: 0166
Revises: 0165
Create Date: 2026-11-29 04:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op


revision: str = '0166'
down_revision: str | None = '0165'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('chat_sessions', schema=None) as batch_op:
        batch_op.add_column(
            sa.Column('session_metadata', sa.JSON(), server_default=sa.text("'{}'"), nullable=False)
        )
    op.create_table(
        'session_metadata',
        sa.Column('session_id', sa.String(), nullable=False),
        sa.Column('key', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column('value', sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.ForeignKeyConstraint(['session_id'], ['chat_sessions.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('session_id', 'key'),
    )
    with op.batch_alter_table('session_metadata', schema=None) as batch_op:
        batch_op.create_index('ix_session_metadata_key_value', ['key', 'value'], unique=False)
    op.create_table(
        'service_secrets',
        sa.Column('name', sqlmodel.sql.sqltypes.AutoString(length=50), nullable=False),
        sa.Column('value', sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.PrimaryKeyConstraint('name'),
    )


def downgrade() -> None:
    op.drop_table('service_secrets')
    with op.batch_alter_table('session_metadata', schema=None) as batch_op:
        batch_op.drop_index('ix_session_metadata_key_value')
    op.drop_table('session_metadata')
    with op.batch_alter_table('chat_sessions', schema=None) as batch_op:
        batch_op.drop_column('session_metadata')
