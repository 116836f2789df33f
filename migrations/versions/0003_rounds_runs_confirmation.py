"""rounds, the contention guard, runs, several measurements per trial, one-sided confidence

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 18:30:00

A trial now keeps every measurement of its configuration (the search's, the baseline timed again in
later runs, confirmations, re-measurements), each tagged with the run that took it. Stored
``confidence`` values were two-sided; each bound of a two-sided interval at c is a one-sided bound at
1 - (1 - c) / 2, which is what the column means from this revision on.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

_NEW_METRICS = [
    ('rounds', sa.Integer),
    ('discarded_rounds', sa.Integer),
    ('round_spread', sa.Float),
    ('p99_bound', lambda: sa.String(length=32)),
    ('probe_ratio_max', sa.Float),
    ('load_average', sa.Float),
    ('roofline_suspect', sa.Boolean),
]


def upgrade() -> None:
    op.create_table('pareto_runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('study_id', sa.Integer(), nullable=True),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('environment_id', sa.Integer(), nullable=False),
    sa.Column('hostname', sa.String(length=256), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('probe_reference_ms', sa.Float(), nullable=True),
    sa.Column('details', sa.JSON(), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['environment_id'], ['pareto_environments.id'], ),
    sa.ForeignKeyConstraint(['study_id'], ['pareto_studies.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('pareto_runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_pareto_runs_study_id'), ['study_id'], unique=False)

    with op.batch_alter_table('pareto_calibrations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('suspect_reason', sa.Text(), nullable=True))

    unique_on_trial = [
        uc['name'] for uc in sa.inspect(op.get_bind()).get_unique_constraints('pareto_measurements')
        if uc['column_names'] == ['trial_id']
    ]
    # SQLite reflects the unnamed constraint of revision 0001 without a name: the convention names it
    with op.batch_alter_table(
        'pareto_measurements', schema=None,
        naming_convention={'uq': 'uq_%(table_name)s_%(column_0_name)s'},
    ) as batch_op:
        for name in unique_on_trial:
            batch_op.drop_constraint(name or 'uq_pareto_measurements_trial_id', type_='unique')
        batch_op.add_column(sa.Column('run_id', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('kind', sa.String(length=16), nullable=False, server_default='search'))
        for name, sql_type in _NEW_METRICS:
            batch_op.add_column(sa.Column(name, sql_type(), nullable=True))
        batch_op.create_foreign_key(
            'fk_pareto_measurements_run_id', 'pareto_runs', ['run_id'], ['id'], ondelete='SET NULL'
        )
        batch_op.create_index(batch_op.f('ix_pareto_measurements_trial_id'), ['trial_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_pareto_measurements_run_id'), ['run_id'], unique=False)

    op.execute("UPDATE pareto_measurements SET confidence = 1 - (1 - confidence) / 2")


def downgrade() -> None:
    op.execute("UPDATE pareto_measurements SET confidence = 1 - 2 * (1 - confidence)")
    op.execute("DELETE FROM pareto_measurements WHERE kind <> 'search'")
    with op.batch_alter_table('pareto_measurements', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_pareto_measurements_run_id'))
        batch_op.drop_index(batch_op.f('ix_pareto_measurements_trial_id'))
        batch_op.drop_constraint('fk_pareto_measurements_run_id', type_='foreignkey')
        for name, _ in reversed(_NEW_METRICS):
            batch_op.drop_column(name)
        batch_op.drop_column('kind')
        batch_op.drop_column('run_id')
        batch_op.create_unique_constraint('uq_pareto_measurements_trial_id', ['trial_id'])
    with op.batch_alter_table('pareto_calibrations', schema=None) as batch_op:
        batch_op.drop_column('suspect_reason')
    with op.batch_alter_table('pareto_runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_pareto_runs_study_id'))
    op.drop_table('pareto_runs')
