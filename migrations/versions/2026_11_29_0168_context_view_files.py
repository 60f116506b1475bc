"""what a compacted model call left out names the attached files too

`context_views.elided_file_ids`: the files (images, documents) a model call sent as a placeholder instead
of their content, beside the tool results it elided, so the view still rebuilds the exact prompt ('[]'
for the rows from before, which elided no file). ALTER TABLE ADD COLUMN with a default: every row kept.

Revision ID: 0168
Revises: 0167
Create Date: 2026-11-29 07:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0168'
down_revision: str | None = '0167'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('context_views', schema=None) as batch_op:
        batch_op.add_column(
            sa.Column('elided_file_ids', sa.JSON(), server_default=sa.text("'[]'"), nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table('context_views', schema=None) as batch_op:
        batch_op.drop_column('elided_file_ids')
