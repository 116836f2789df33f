"""the first-round latency of a trial rejected early

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03 18:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('pareto_trials', schema=None) as batch_op:
        batch_op.add_column(sa.Column('early_latency', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('pareto_trials', schema=None) as batch_op:
        batch_op.drop_column('early_latency')
