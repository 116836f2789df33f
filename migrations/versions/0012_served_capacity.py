"""the capacity a user gets: the serving runs a trial's costs were measured in, and the load-run capacity

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07 10:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None

_COLUMNS = (
    ('serving_runs', sa.JSON()),
    ('serve_threads', sa.Integer()),
    ('load_capacity_qps', sa.Float()),
    ('load_capacity_max_batch', sa.Integer()),
    ('load_capacity_max_wait_ms', sa.Float()),
)


def upgrade() -> None:
    with op.batch_alter_table('pareto_measurements', schema=None) as batch_op:
        for name, type_ in _COLUMNS:
            batch_op.add_column(sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('pareto_measurements', schema=None) as batch_op:
        for name, _ in reversed(_COLUMNS):
            batch_op.drop_column(name)
