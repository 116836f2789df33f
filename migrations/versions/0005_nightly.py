"""nightly jobs and the round medians their regression tests compare

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03 07:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('pareto_nightly_runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('study_id', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('environment_id', sa.Integer(), nullable=False),
    sa.Column('hostname', sa.String(length=256), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('pick_before', sa.Integer(), nullable=True),
    sa.Column('pick_after', sa.Integer(), nullable=True),
    sa.Column('trials_run', sa.Integer(), nullable=False),
    sa.Column('regressions', sa.Integer(), nullable=False),
    sa.Column('summary', sa.JSON(), nullable=False),
    sa.Column('summary_path', sa.Text(), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['environment_id'], ['pareto_environments.id'], ),
    sa.ForeignKeyConstraint(['study_id'], ['pareto_studies.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('pareto_nightly_runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_pareto_nightly_runs_study_id'), ['study_id'], unique=False)

    with op.batch_alter_table('pareto_measurements', schema=None) as batch_op:
        batch_op.add_column(sa.Column('round_medians_ms', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('pareto_measurements', schema=None) as batch_op:
        batch_op.drop_column('round_medians_ms')
    with op.batch_alter_table('pareto_nightly_runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_pareto_nightly_runs_study_id'))
    op.drop_table('pareto_nightly_runs')
