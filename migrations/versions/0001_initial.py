"""initial schema: studies, trials, measurements, environments

Revision ID: 0001
Revises: 
Create Date: 2026-12-02 10:35:25.657941
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('pareto_environments',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('device', sa.String(length=32), nullable=False),
    sa.Column('device_name', sa.String(length=256), nullable=False),
    sa.Column('driver', sa.String(length=128), nullable=True),
    sa.Column('torch_version', sa.String(length=64), nullable=False),
    sa.Column('cpu_model', sa.String(length=256), nullable=False),
    sa.Column('threads', sa.Integer(), nullable=False),
    sa.Column('hostname', sa.String(length=256), nullable=False),
    sa.Column('details', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('key')
    )
    op.create_table('pareto_studies',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=256), nullable=False),
    sa.Column('task', sa.String(length=512), nullable=False),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name')
    )
    op.create_table('pareto_trials',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('study_id', sa.Integer(), nullable=False),
    sa.Column('optuna_number', sa.Integer(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.Column('config_key', sa.String(length=64), nullable=False),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('is_baseline', sa.Boolean(), nullable=False),
    sa.Column('batch_size', sa.Integer(), nullable=False),
    sa.Column('environment_id', sa.Integer(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('compress_s', sa.Float(), nullable=True),
    sa.Column('latency_s', sa.Float(), nullable=True),
    sa.Column('accuracy_s', sa.Float(), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['environment_id'], ['pareto_environments.id'], ),
    sa.ForeignKeyConstraint(['study_id'], ['pareto_studies.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('study_id', 'optuna_number', name='uq_trial_study_optuna_number')
    )
    with op.batch_alter_table('pareto_trials', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_pareto_trials_config_key'), ['config_key'], unique=False)
        batch_op.create_index(batch_op.f('ix_pareto_trials_study_id'), ['study_id'], unique=False)

    op.create_table('pareto_measurements',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('trial_id', sa.Integer(), nullable=False),
    sa.Column('environment_id', sa.Integer(), nullable=False),
    sa.Column('accuracy', sa.Float(), nullable=False),
    sa.Column('batch_size', sa.Integer(), nullable=False),
    sa.Column('latency_mean_ms', sa.Float(), nullable=False),
    sa.Column('latency_p50_ms', sa.Float(), nullable=False),
    sa.Column('latency_p50_lower_ms', sa.Float(), nullable=True),
    sa.Column('latency_p50_upper_ms', sa.Float(), nullable=True),
    sa.Column('latency_p90_ms', sa.Float(), nullable=False),
    sa.Column('latency_p99_ms', sa.Float(), nullable=False),
    sa.Column('latency_p99_lower_ms', sa.Float(), nullable=True),
    sa.Column('latency_p99_upper_ms', sa.Float(), nullable=True),
    sa.Column('latency_p999_ms', sa.Float(), nullable=False),
    sa.Column('p99_p50_ratio', sa.Float(), nullable=False),
    sa.Column('samples', sa.Integer(), nullable=False),
    sa.Column('warmup', sa.Integer(), nullable=False),
    sa.Column('confidence', sa.Float(), nullable=False),
    sa.Column('method', sa.Text(), nullable=False),
    sa.Column('throughput_per_s', sa.Float(), nullable=False),
    sa.Column('params_bytes', sa.BigInteger(), nullable=False),
    sa.Column('theoretical_bytes', sa.BigInteger(), nullable=False),
    sa.Column('compression_ratio', sa.Float(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['environment_id'], ['pareto_environments.id'], ),
    sa.ForeignKeyConstraint(['trial_id'], ['pareto_trials.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('trial_id')
    )


def downgrade() -> None:
    op.drop_table('pareto_measurements')
    with op.batch_alter_table('pareto_trials', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_pareto_trials_study_id'))
        batch_op.drop_index(batch_op.f('ix_pareto_trials_config_key'))

    op.drop_table('pareto_trials')
    op.drop_table('pareto_studies')
    op.drop_table('pareto_environments')
