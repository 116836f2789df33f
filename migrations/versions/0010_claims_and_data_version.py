"""claims and the data version: one running trial per configuration, one preferred measurement per trial and
environment, and a counter every writing transaction moves

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06 19:00:00
"""

from __future__ import annotations

from datetime import datetime, timezone

import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

_TRIALS = sa.table(
    'pareto_trials',
    sa.column('id', sa.Integer()),
    sa.column('study_id', sa.Integer()),
    sa.column('environment_id', sa.Integer()),
    sa.column('config_key', sa.String()),
    sa.column('state', sa.String()),
    sa.column('error', sa.Text()),
    sa.column('finished_at', sa.DateTime(timezone=True)),
)
_MEASUREMENTS = sa.table(
    'pareto_measurements',
    sa.column('id', sa.Integer()),
    sa.column('trial_id', sa.Integer()),
    sa.column('environment_id', sa.Integer()),
    sa.column('preferred', sa.Boolean()),
)


def upgrade() -> None:
    bind = op.get_bind()
    # rows stored before the indexes could hold two of a kind: the later running twin is failed (it was
    # measuring what another trial measured), the later preferred measurement is the one kept
    running = bind.execute(
        sa.select(_TRIALS.c.id, _TRIALS.c.study_id, _TRIALS.c.environment_id, _TRIALS.c.config_key)
        .where(_TRIALS.c.state == 'RUNNING')
        .order_by(_TRIALS.c.id)
    ).all()
    seen: set[tuple[int, int, str]] = set()
    for row in running:
        where = (row.study_id, row.environment_id, row.config_key)
        if where in seen:
            bind.execute(
                sa.update(_TRIALS)
                .where(_TRIALS.c.id == row.id)
                .values(
                    state='FAILED',
                    error='interrupted: running beside an earlier trial of the same configuration',
                    finished_at=datetime.now(timezone.utc),
                )
            )
        seen.add(where)
    preferred = bind.execute(
        sa.select(_MEASUREMENTS.c.id, _MEASUREMENTS.c.trial_id, _MEASUREMENTS.c.environment_id)
        .where(_MEASUREMENTS.c.preferred.is_(True))
        .order_by(_MEASUREMENTS.c.id.desc())
    ).all()
    kept: set[tuple[int, int]] = set()
    for row in preferred:
        if (row.trial_id, row.environment_id) in kept:
            bind.execute(sa.update(_MEASUREMENTS).where(_MEASUREMENTS.c.id == row.id).values(preferred=False))
        kept.add((row.trial_id, row.environment_id))
    op.create_index(
        'uq_pareto_trials_running',
        'pareto_trials',
        ['study_id', 'environment_id', 'config_key'],
        unique=True,
        sqlite_where=sa.text("state = 'RUNNING'"),
        postgresql_where=sa.text("state = 'RUNNING'"),
    )
    op.create_index(
        'uq_pareto_measurements_preferred',
        'pareto_measurements',
        ['trial_id', 'environment_id'],
        unique=True,
        sqlite_where=sa.text('preferred'),
        postgresql_where=sa.text('preferred'),
    )
    version = op.create_table(
        'pareto_data_version',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('version', sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )
    op.bulk_insert(version, [{'id': 1, 'version': 0}])


def downgrade() -> None:
    op.drop_table('pareto_data_version')
    op.drop_index('uq_pareto_measurements_preferred', table_name='pareto_measurements')
    op.drop_index('uq_pareto_trials_running', table_name='pareto_trials')
