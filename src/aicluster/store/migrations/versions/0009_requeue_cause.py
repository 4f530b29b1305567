"""Why a job was last put back in the queue (core.lifecycle.RequeueCause), as its own
column rather than the first words of its message.

Revision ID: 0009_requeue_cause
"""

import sqlalchemy as sa
from alembic import op

revision = "0009_requeue_cause"
down_revision = "0008_job_names"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("requeue_cause", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("requeue_cause")
