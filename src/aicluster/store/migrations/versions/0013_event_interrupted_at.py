"""When an interrupted attempt stopped making progress, on the event that ends it: recovery
is measured from there (detection, queue, launch), not from the requeue.

Revision ID: 0013_event_interrupted_at
"""

import sqlalchemy as sa
from alembic import op

revision = "0013_event_interrupted_at"
down_revision = "0012_node_machine"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.add_column(sa.Column("interrupted_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.drop_column("interrupted_at")
