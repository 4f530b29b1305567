"""Team budgets and caps: a monthly budget with its warning threshold and enforcement, a
cap on GPUs held at once and on queued jobs, the months of the last crossings and what the
team spent this month as the leader last computed it (store.budgets).

Revision ID: 0023_team_budgets
"""

import sqlalchemy as sa
from alembic import op

revision = "0023_team_budgets"
down_revision = "0022_tokens_team_sums"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "team_budgets",
        sa.Column("team", sa.String(64), sa.ForeignKey("teams.name"), primary_key=True),
        sa.Column("monthly_micros", sa.BigInteger, nullable=False),
        sa.Column("warn_at", sa.Float, nullable=False),
        sa.Column("enforce", sa.Boolean, nullable=False),
        sa.Column("max_gpus", sa.BigInteger, nullable=True),
        sa.Column("max_queued_jobs", sa.BigInteger, nullable=True),
        sa.Column("last_warned_month", sa.String(7), nullable=True),
        sa.Column("last_over_month", sa.String(7), nullable=True),
        sa.Column("spent_month", sa.String(7), nullable=True),
        sa.Column("spent_micros", sa.BigInteger, nullable=True),
        sa.Column("spent_at", sa.Float, nullable=True),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("updated_by", sa.String(64), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("team_budgets")
