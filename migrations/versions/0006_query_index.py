"""indexes for best and frontier at 100 000 trials: each measurement's study and whether queries use it

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# the measurement queries use: of a completed trial in an environment, the latest confirmation, else
# the first search measurement
BACKFILL_PREFERRED = """
UPDATE pareto_measurements SET preferred = EXISTS (
    SELECT 1 FROM pareto_trials t WHERE t.id = pareto_measurements.trial_id AND t.state = 'COMPLETE'
) AND (
    (kind = 'confirm' AND NOT EXISTS (
        SELECT 1 FROM pareto_measurements c
        WHERE c.trial_id = pareto_measurements.trial_id AND c.environment_id = pareto_measurements.environment_id
          AND c.kind = 'confirm' AND c.id > pareto_measurements.id))
    OR (kind = 'search' AND NOT EXISTS (
        SELECT 1 FROM pareto_measurements c
        WHERE c.trial_id = pareto_measurements.trial_id AND c.environment_id = pareto_measurements.environment_id
          AND (c.kind = 'confirm' OR (c.kind = 'search' AND c.id < pareto_measurements.id))))
)
"""


def upgrade() -> None:
    with op.batch_alter_table("pareto_measurements", schema=None) as batch_op:
        batch_op.add_column(sa.Column("study_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("preferred", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch_op.create_foreign_key(
            "fk_pareto_measurements_study_id",
            "pareto_studies",
            ["study_id"],
            ["id"],
            ondelete="CASCADE",
        )
    op.execute(
        "UPDATE pareto_measurements SET study_id = "
        "(SELECT t.study_id FROM pareto_trials t WHERE t.id = pareto_measurements.trial_id)"
    )
    op.execute(BACKFILL_PREFERRED)
    with op.batch_alter_table("pareto_measurements", schema=None) as batch_op:
        batch_op.create_index(
            "ix_pareto_measurements_choice",
            ["study_id", "environment_id", "preferred", "accuracy", "latency_p99_upper_ms", "samples", "trial_id"],
            unique=False,
        )
        batch_op.create_index(
            "ix_pareto_measurements_study_env", ["study_id", "environment_id", "created_at"], unique=False
        )
    with op.batch_alter_table("pareto_trials", schema=None) as batch_op:
        batch_op.create_index("ix_pareto_trials_study_baseline", ["study_id", "is_baseline"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("pareto_trials", schema=None) as batch_op:
        batch_op.drop_index("ix_pareto_trials_study_baseline")
    with op.batch_alter_table("pareto_measurements", schema=None) as batch_op:
        batch_op.drop_index("ix_pareto_measurements_study_env")
        batch_op.drop_index("ix_pareto_measurements_choice")
        batch_op.drop_constraint("fk_pareto_measurements_study_id", type_="foreignkey")
        batch_op.drop_column("preferred")
        batch_op.drop_column("study_id")
