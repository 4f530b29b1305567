"""Team quotas per pool.

Revision ID: 0004_quotas
"""

import sqlalchemy as sa
from alembic import op

revision = "0004_quotas"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "quotas",
        sa.Column("team", sa.String(64), sa.ForeignKey("teams.name"), primary_key=True),
        sa.Column("pool", sa.String(64), primary_key=True),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("borrow_gpus", sa.Integer, nullable=True),
        sa.Column("lend_gpus", sa.Integer, nullable=True),
        sa.Column("cpus", sa.Float, nullable=True),
        sa.Column("memory", sa.Integer, nullable=True),
        sa.Column("weight", sa.Float, nullable=False),
        sa.Column("cohort", sa.String(64), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("quotas")
