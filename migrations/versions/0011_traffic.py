"""the traffic scenario: requests arriving at a rate, the batcher, per-request latency, capacity, load runs

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07 03:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None

_COLUMNS = (
    ('scenario', sa.String(length=16)),
    ('qps', sa.Float()),
    ('max_batch', sa.Integer()),
    ('max_wait_ms', sa.Float()),
    ('requests', sa.Integer()),
    ('request_p50_ms', sa.Float()),
    ('request_p99_ms', sa.Float()),
    ('request_p99_upper_ms', sa.Float()),
    ('capacity_qps', sa.Float()),
    ('capacity_max_batch', sa.Integer()),
    ('capacity_max_wait_ms', sa.Float()),
    ('service_curve', sa.JSON()),
    ('traffic_curve', sa.JSON()),
)


def upgrade() -> None:
    with op.batch_alter_table('pareto_measurements', schema=None) as batch_op:
        for name, type_ in _COLUMNS:
            batch_op.add_column(sa.Column(name, type_, nullable=True))
    op.create_table('pareto_load_runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('trial_id', sa.Integer(), nullable=False),
    sa.Column('environment_id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=True),
    sa.Column('qps', sa.Float(), nullable=False),
    sa.Column('max_batch', sa.Integer(), nullable=False),
    sa.Column('max_wait_ms', sa.Float(), nullable=False),
    sa.Column('request_p99_upper_ms', sa.Float(), nullable=True),
    sa.Column('kept_up', sa.Boolean(), nullable=False),
    sa.Column('valid', sa.Boolean(), nullable=False),
    sa.Column('summary', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['environment_id'], ['pareto_environments.id'], ),
    sa.ForeignKeyConstraint(['run_id'], ['pareto_runs.id'], ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['trial_id'], ['pareto_trials.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('pareto_load_runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_pareto_load_runs_trial_id'), ['trial_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('pareto_load_runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_pareto_load_runs_trial_id'))
    op.drop_table('pareto_load_runs')
    with op.batch_alter_table('pareto_measurements', schema=None) as batch_op:
        for name, _ in reversed(_COLUMNS):
            batch_op.drop_column(name)
