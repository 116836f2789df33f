"""frozen reference models timed beside a study's pick by its nightlies

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'pareto_reference_models',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('study_id', sa.Integer(), nullable=False),
        sa.Column('environment_id', sa.Integer(), nullable=False),
        sa.Column('digest', sa.String(length=64), nullable=False),
        sa.Column('source', sa.Text(), nullable=False),
        sa.Column('program', sa.LargeBinary(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['environment_id'], ['pareto_environments.id']),
        sa.ForeignKeyConstraint(['study_id'], ['pareto_studies.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('study_id', 'digest'),
    )
    with op.batch_alter_table('pareto_reference_models', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_pareto_reference_models_study_id'), ['study_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('pareto_reference_models', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_pareto_reference_models_study_id'))
    op.drop_table('pareto_reference_models')
