"""Node states.

Revision ID: 0003_nodes
"""

import sqlalchemy as sa
from alembic import op

revision = "0003_nodes"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "nodes",
        sa.Column("node_id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("since", sa.Float, nullable=False),
        sa.Column("drain_deadline", sa.Float, nullable=True),
        sa.Column("checks", sa.Text, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("nodes")
