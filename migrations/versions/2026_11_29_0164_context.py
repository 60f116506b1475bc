"""context compaction: a session's context policy, its running summaries and what each call sent

chat_sessions gets `context` (the policy as JSON; NULL: the settings' defaults, as for every session
stored before) and `context_scale` (the provider's prompt count over the estimate; NULL: none yet).
Two new tables: context_summaries (a summary keyed by the session and the last turn it covers) and
context_views (what a model call sent instead of the whole history). Existing rows are untouched.

Revision ID: 0164
Revises: 0163
Create Date: 2026-11-29 04:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0164'
down_revision: str | None = '0163'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('chat_sessions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('context', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('context_scale', sa.Float(), nullable=True))
    op.create_table(
        'context_summaries',
        sa.Column('position', sa.Integer(), nullable=False),
        sa.Column('id', sa.String(length=40), nullable=False),
        sa.Column('session_id', sa.String(), nullable=False),
        sa.Column('through_turn_id', sa.String(length=40), nullable=False),
        sa.Column('turn_ids', sa.JSON(), nullable=False),
        sa.Column('previous_id', sa.String(length=40), nullable=True),
        sa.Column('content', sa.String(), nullable=False),
        sa.Column('turn_id', sa.String(length=40), nullable=False),
        sa.Column('model', sa.String(), nullable=False),
        sa.Column('created_at', sa.String(), nullable=False),
        sa.ForeignKeyConstraint(['session_id'], ['chat_sessions.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('position'),
        sa.UniqueConstraint('id'),
    )
    op.create_index(
        'ix_context_summaries_session_through',
        'context_summaries',
        ['session_id', 'through_turn_id'],
        unique=False,
    )
    op.create_table(
        'context_views',
        sa.Column('position', sa.Integer(), nullable=False),
        sa.Column('session_id', sa.String(), nullable=False),
        sa.Column('turn_id', sa.String(length=40), nullable=False),
        sa.Column('summary_id', sa.String(length=40), nullable=True),
        sa.Column('summarized_turn_ids', sa.JSON(), nullable=False),
        sa.Column('elided_tool_call_ids', sa.JSON(), nullable=False),
        sa.Column('tokens_before', sa.Integer(), nullable=False),
        sa.Column('tokens_after', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.String(), nullable=False),
        sa.ForeignKeyConstraint(['session_id'], ['chat_sessions.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('position'),
    )
    op.create_index('ix_context_views_turn', 'context_views', ['turn_id'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_context_views_turn', table_name='context_views')
    op.drop_table('context_views')
    op.drop_index('ix_context_summaries_session_through', table_name='context_summaries')
    op.drop_table('context_summaries')
    with op.batch_alter_table('chat_sessions', schema=None) as batch_op:
        batch_op.drop_column('context_scale')
        batch_op.drop_column('context')
