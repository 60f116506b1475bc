"""files: uploaded files, their content-addressed blobs in parts, and the messages that use them

`files` holds one row per principal and content (a unique index on principal + sha256: the same bytes
uploaded twice are stored once); `file_chunks` the bytes, keyed by sha256 and part number, shared by every
file with those bytes; `message_files` links a message (waiting or taken) to the files it attaches, and
goes with its session. chat_messages and queued_messages gain `attachments` (what their events show of
each file). New tables and nullable columns only: existing rows stay as they are (attachments NULL).

Revision ID: 0165
Revises: 0164
Create Date: 2026-11-29 04:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0165'
down_revision: str | None = '0164'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'files',
        sa.Column('id', sa.String(length=40), nullable=False),
        sa.Column('principal', sa.String(length=100), nullable=False),
        sa.Column('name', sa.String(length=255), nullable=False),
        sa.Column('media_type', sa.String(length=100), nullable=False),
        sa.Column('size', sa.BigInteger(), nullable=False),
        sa.Column('sha256', sa.String(length=64), nullable=False),
        sa.Column('created_at', sa.String(), nullable=False),
        sa.Column('width', sa.Integer(), nullable=True),
        sa.Column('height', sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ux_files_principal_sha256', 'files', ['principal', 'sha256'], unique=True)
    op.create_index('ix_files_principal_created', 'files', ['principal', 'created_at', 'id'])
    op.create_index('ix_files_sha256', 'files', ['sha256'])
    op.create_table(
        'file_chunks',
        sa.Column('sha256', sa.String(length=64), nullable=False),
        sa.Column('part', sa.Integer(), nullable=False),
        sa.Column('data', sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint('sha256', 'part'),
    )
    op.create_table(
        'message_files',
        sa.Column('message_id', sa.String(length=20), nullable=False),
        sa.Column('file_id', sa.String(length=40), nullable=False),
        sa.Column('session_id', sa.String(), nullable=False),
        sa.ForeignKeyConstraint(['file_id'], ['files.id']),
        sa.ForeignKeyConstraint(['session_id'], ['chat_sessions.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('message_id', 'file_id'),
    )
    op.create_index('ix_message_files_file', 'message_files', ['file_id'])
    op.create_index('ix_message_files_session', 'message_files', ['session_id'])
    with op.batch_alter_table('chat_messages', schema=None) as batch_op:
        batch_op.add_column(sa.Column('attachments', sa.JSON(), nullable=True))
    with op.batch_alter_table('queued_messages', schema=None) as batch_op:
        batch_op.add_column(sa.Column('attachments', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('queued_messages', schema=None) as batch_op:
        batch_op.drop_column('attachments')
    with op.batch_alter_table('chat_messages', schema=None) as batch_op:
        batch_op.drop_column('attachments')
    op.drop_index('ix_message_files_session', table_name='message_files')
    op.drop_index('ix_message_files_file', table_name='message_files')
    op.drop_table('message_files')
    op.drop_table('file_chunks')
    op.drop_index('ix_files_sha256', table_name='files')
    op.drop_index('ix_files_principal_created', table_name='files')
    op.drop_index('ux_files_principal_sha256', table_name='files')
    op.drop_table('files')
