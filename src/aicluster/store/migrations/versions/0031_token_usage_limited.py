"""Requests refused by a rate limit, in the gateway's token usage sums (the `limited`
column: 429s counted per minute, team, token and service, as every other request is).

Revision ID: 0031_token_usage_limited
"""

import sqlalchemy as sa
from alembic import op

revision = "0031_token_usage_limited"
down_revision = "0030_artifact_quotas"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("token_usage") as batch:
        batch.add_column(sa.Column("limited", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("token_usage") as batch:
        batch.drop_column("limited")
