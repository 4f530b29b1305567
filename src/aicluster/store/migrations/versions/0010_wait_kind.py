"""What a PENDING job waits for (core.model.WaitKind), as its own column rather than the
first words of its message; None once the job leaves PENDING.

Revision ID: 0010_wait_kind
"""

import sqlalchemy as sa
from alembic import op

revision = "0010_wait_kind"
down_revision = "0009_requeue_cause"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("wait_kind", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("wait_kind")
