"""Scoped, expiring job tokens (one live token per job attempt) and the Unix uid that
each team's workloads run as.

Revision ID: 0006_scoped_tokens
"""

import sqlalchemy as sa
from alembic import op

revision = "0006_scoped_tokens"
down_revision = "0005_job_tokens"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        batch.add_column(sa.Column("scope", sa.String(16), nullable=False, server_default="user"))
        batch.add_column(sa.Column("expires_at", sa.Float(), nullable=True))
        batch.add_column(sa.Column("attempt", sa.Integer(), nullable=True))
    with op.batch_alter_table("teams") as batch:
        batch.add_column(sa.Column("uid", sa.Integer(), nullable=True))
        batch.create_index("ix_teams_uid", ["uid"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("teams") as batch:
        batch.drop_index("ix_teams_uid")
        batch.drop_column("uid")
    with op.batch_alter_table("tokens") as batch:
        batch.drop_column("attempt")
        batch.drop_column("expires_at")
        batch.drop_column("scope")
