"""four axes, roofline, throughput curve, compile time, calibrations

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 11:05:08.617851
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('pareto_calibrations',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('environment_id', sa.Integer(), nullable=False),
    sa.Column('peak_flops', sa.JSON(), nullable=False),
    sa.Column('memory_bandwidth_bytes_per_s', sa.Float(), nullable=False),
    sa.Column('method', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['environment_id'], ['pareto_environments.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('pareto_calibrations', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_pareto_calibrations_environment_id'), ['environment_id'], unique=False)

    with op.batch_alter_table('pareto_measurements', schema=None) as batch_op:
        batch_op.add_column(sa.Column('activation_bytes', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('kv_cache_bytes', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('memory_bytes', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('flops', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('bytes_moved', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('arithmetic_intensity', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('hardware_profile', sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column('roofline_bound_ms', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('regime', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('achieved_fraction', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('throughput_curve', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('saturation_batch', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('max_batch_within_slo', sa.Integer(), nullable=True))

    with op.batch_alter_table('pareto_trials', schema=None) as batch_op:
        batch_op.add_column(sa.Column('compile_s', sa.Float(), nullable=True))



def downgrade() -> None:
    with op.batch_alter_table('pareto_trials', schema=None) as batch_op:
        batch_op.drop_column('compile_s')

    with op.batch_alter_table('pareto_measurements', schema=None) as batch_op:
        batch_op.drop_column('max_batch_within_slo')
        batch_op.drop_column('saturation_batch')
        batch_op.drop_column('throughput_curve')
        batch_op.drop_column('achieved_fraction')
        batch_op.drop_column('regime')
        batch_op.drop_column('roofline_bound_ms')
        batch_op.drop_column('hardware_profile')
        batch_op.drop_column('arithmetic_intensity')
        batch_op.drop_column('bytes_moved')
        batch_op.drop_column('flops')
        batch_op.drop_column('memory_bytes')
        batch_op.drop_column('kv_cache_bytes')
        batch_op.drop_column('activation_bytes')

    with op.batch_alter_table('pareto_calibrations', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_pareto_calibrations_environment_id'))

    op.drop_table('pareto_calibrations')
