"""Tokens made for a job (revoked when it ends).

Revision ID: 0005_job_tokens
"""

import sqlalchemy as sa
from alembic import op

revision = "0005_job_tokens"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        batch.add_column(sa.Column("job_id", sa.String(80), nullable=True))
        batch.create_index("ix_tokens_job_id", ["job_id"])


def downgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        batch.drop_index("ix_tokens_job_id")
        batch.drop_column("job_id")
