"""the P99.9's upper bound

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02 19:45:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('pareto_measurements', schema=None) as batch_op:
        batch_op.add_column(sa.Column('latency_p999_upper_ms', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('pareto_measurements', schema=None) as batch_op:
        batch_op.drop_column('latency_p999_upper_ms')
