"""When a running job last saved a checkpoint (`jobs.last_checkpoint_at`): written when a
job's own token commits a version of its checkpoint artifact, read by the scheduler to
know what stopping or moving the job would lose (core.model.RunningWorkload).

Revision ID: 0033_job_last_checkpoint
"""

import sqlalchemy as sa
from alembic import op

revision = "0033_job_last_checkpoint"
down_revision = "0032_doctor_reports"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("last_checkpoint_at", sa.Float, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("last_checkpoint_at")
