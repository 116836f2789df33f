"""the serving layout: the model instances a configuration at a rate is served with, and the layout
(instances, intra-op threads) its load-run capacity was found in

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07 16:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


_COLUMNS = ('serve_instances', 'load_capacity_instances', 'load_capacity_threads')


def upgrade() -> None:
    with op.batch_alter_table('pareto_measurements', schema=None) as batch_op:
        for name in _COLUMNS:
            batch_op.add_column(sa.Column(name, sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('pareto_measurements', schema=None) as batch_op:
        for name in reversed(_COLUMNS):
            batch_op.drop_column(name)
