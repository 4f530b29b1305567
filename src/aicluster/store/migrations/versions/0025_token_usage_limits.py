"""Token usage from the gateways (sums per minute, team, service and token; the batches
taken), per-token prices on the rate cards (per million input and output tokens, per
service), and rate limits per team and per token (store.token_usage, store.rate_limits).

Revision ID: 0025_token_usage_limits
"""

import sqlalchemy as sa
from alembic import op

revision = "0025_token_usage_limits"
down_revision = "0024_usage_replicas_storage"
branch_labels = None
depends_on = None

SUMS = ("requests", "errors", "prompt_tokens", "completion_tokens", "cost_micros")


def upgrade() -> None:
    op.create_table(
        "token_usage",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("minute", sa.BigInteger, nullable=False),
        sa.Column("team", sa.String(64), nullable=False),
        sa.Column("user", sa.String(64), nullable=False),
        sa.Column("token_id", sa.Integer, nullable=False),
        sa.Column("service", sa.String(128), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        *(sa.Column(name, sa.BigInteger, nullable=False) for name in SUMS),
        sa.UniqueConstraint(
            "minute", "team", "service", "token_id", "user", "model", name="uq_token_usage_key"
        ),
    )
    op.create_index("ix_token_usage_team_minute", "token_usage", ["team", "minute"])
    op.create_index("ix_token_usage_minute", "token_usage", ["minute"])
    op.create_table(
        "token_usage_batches",
        sa.Column("batch_id", sa.String(80), primary_key=True),
        sa.Column("source", sa.String(80), nullable=False),
        sa.Column("rows", sa.Integer, nullable=False),
        sa.Column("accepted_at", sa.Float, nullable=False),
    )
    op.create_index("ix_token_usage_batches_accepted_at", "token_usage_batches", ["accepted_at"])
    op.create_table(
        "rate_limits",
        sa.Column("scope", sa.String(8), primary_key=True),
        sa.Column("subject", sa.String(64), primary_key=True),
        sa.Column("requests_per_s", sa.Float, nullable=True),
        sa.Column("burst", sa.Integer, nullable=True),
        sa.Column("tokens_per_min", sa.BigInteger, nullable=True),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("actor", sa.String(64), nullable=True),
    )
    with op.batch_alter_table("prices") as batch:
        batch.add_column(sa.Column("service", sa.String(128), nullable=True))
        batch.add_column(sa.Column("input_mtok", sa.Float, nullable=True))
        batch.add_column(sa.Column("output_mtok", sa.Float, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("prices") as batch:
        batch.drop_column("output_mtok")
        batch.drop_column("input_mtok")
        batch.drop_column("service")
    op.drop_table("rate_limits")
    op.drop_index("ix_token_usage_batches_accepted_at", table_name="token_usage_batches")
    op.drop_table("token_usage_batches")
    op.drop_index("ix_token_usage_minute", table_name="token_usage")
    op.drop_index("ix_token_usage_team_minute", table_name="token_usage")
    op.drop_table("token_usage")
