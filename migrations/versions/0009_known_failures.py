"""known failures: a configuration that broke is marked, and each technique's checks before a search

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06 15:00:00
"""

from __future__ import annotations

import re

import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # a plain ADD COLUMN: SQLite's batch mode would copy the table, and dropping the old one cascades
    op.add_column('pareto_trials', sa.Column('config_failed', sa.Boolean(), nullable=False, server_default=sa.false()))
    # trials stored before: a failure whose reason is the configuration's own is known from now on, as a
    # new one would be; not an interruption, a worker that stopped, an error of pareto or the database
    # (stored as "TypeName: message"), running out of memory or the uncompressed model's own
    trials = sa.table(
        'pareto_trials',
        sa.column('id', sa.Integer()),
        sa.column('state', sa.String()),
        sa.column('error', sa.Text()),
        sa.column('is_baseline', sa.Boolean()),
        sa.column('config_failed', sa.Boolean()),
    )
    bind = op.get_bind()
    rows = bind.execute(
        sa.select(trials.c.id, trials.c.error).where(
            trials.c.state == 'FAILED', trials.c.is_baseline.is_(False), trials.c.error.is_not(None)
        )
    ).all()
    not_the_configuration = re.compile(
        r"^(interrupted|its worker stopped|[A-Z]\w*(Error|Exception|Interrupt|Exit)\b)|ran out of memory"
        r"|the throughput sweep failed"
    )
    known = [row.id for row in rows if not not_the_configuration.search(row.error)]
    if known:
        bind.execute(sa.update(trials).where(trials.c.id.in_(known)).values(config_failed=True))
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
    # a plain DROP COLUMN (SQLite 3.35 and newer): batch mode would copy the table and cascade the drop
    op.drop_column('pareto_trials', 'config_failed')
