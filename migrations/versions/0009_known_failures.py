"""known failures: a configuration that broke is marked, and each technique's checks before a search

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06 15:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # a plain ADD COLUMN: SQLite's batch mode would copy the table, and dropping the old one cascades
    op.add_column('pareto_trials', sa.Column('config_failed', sa.Boolean(), nullable=False, server_default=sa.false()))
    # trials stored before: a failure whose reason is the configuration's own (not an interruption, not a
    # worker that stopped, not the uncompressed model) is known from now on, as a new one would be
    op.execute(
        "UPDATE pareto_trials SET config_failed = TRUE WHERE state = 'FAILED' AND NOT is_baseline "
        "AND error IS NOT NULL AND error NOT LIKE 'interrupted%' AND error NOT LIKE 'its worker stopped%' "
        "AND error NOT LIKE 'KeyboardInterrupt%'"
    )
    op.create_table(
        'pareto_technique_checks',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('study_id', sa.Integer(), nullable=False),
        sa.Column('environment_id', sa.Integer(), nullable=False),
        sa.Column('kind', sa.String(length=16), nullable=False),
        sa.Column('technique', sa.String(length=64), nullable=False),
        sa.Column('config_key', sa.String(length=64), nullable=False),
        sa.Column('ok', sa.Boolean(), nullable=False),
        sa.Column('reason', sa.Text(), nullable=True),
        sa.Column('details', sa.JSON(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['environment_id'], ['pareto_environments.id']),
        sa.ForeignKeyConstraint(['study_id'], ['pareto_studies.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('study_id', 'environment_id', 'kind', 'config_key', name='uq_technique_check'),
    )


def downgrade() -> None:
    op.drop_table('pareto_technique_checks')
    with op.batch_alter_table('pareto_trials', schema=None) as batch_op:
        batch_op.drop_column('config_failed')
