"""A job transition's attempt, on admission its placement and on a requeue its cause, on the
event itself: the history of every attempt (placement, start, end, why it ended) is read
from the events.

Revision ID: 0011_event_attempt
"""

import sqlalchemy as sa
from alembic import op

revision = "0011_event_attempt"
down_revision = "0010_wait_kind"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.add_column(sa.Column("attempt", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("placement", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("requeue_cause", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.drop_column("requeue_cause")
        batch.drop_column("placement")
        batch.drop_column("attempt")
