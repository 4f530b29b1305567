"""Types that hold on PostgreSQL what SQLite always accepted: quota figures up to 2**63-1
(SQLite INTEGER is 64-bit, PostgreSQL's is 32-bit), and an event's object id as long as
the ids it names (a job's or replica's id is a name of up to 63 characters and a 7-character
suffix; SQLite never enforced VARCHAR lengths).

Revision ID: 0017_portable_types
"""

import sqlalchemy as sa
from alembic import op

revision = "0017_portable_types"
down_revision = "0016_linear_history"
branch_labels = None
depends_on = None

QUOTA_COLUMNS = (("gpus", False), ("borrow_gpus", True), ("lend_gpus", True), ("memory", True))


def upgrade() -> None:
    with op.batch_alter_table("quotas") as batch:
        for name, nullable in QUOTA_COLUMNS:
            batch.alter_column(
                name, type_=sa.BigInteger(), existing_type=sa.Integer(), existing_nullable=nullable
            )
    with op.batch_alter_table("events") as batch:
        batch.alter_column(
            "object_id", type_=sa.String(96), existing_type=sa.String(64), existing_nullable=False
        )


def downgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.alter_column(
            "object_id", type_=sa.String(64), existing_type=sa.String(96), existing_nullable=False
        )
    with op.batch_alter_table("quotas") as batch:
        for name, nullable in QUOTA_COLUMNS:
            batch.alter_column(
                name, type_=sa.Integer(), existing_type=sa.BigInteger(), existing_nullable=nullable
            )
