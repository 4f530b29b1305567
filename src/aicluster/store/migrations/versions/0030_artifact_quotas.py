"""Per-team storage quotas of the artifact store (store.artifacts.quotas): the most bytes
a team's artifact versions may keep, who set it and when.

Revision ID: 0030_artifact_quotas
"""

import sqlalchemy as sa
from alembic import op

revision = "0030_artifact_quotas"
down_revision = "0029_gateway_reports"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "artifact_quotas",
        sa.Column("team", sa.String(64), sa.ForeignKey("teams.name"), primary_key=True),
        sa.Column("max_bytes", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("updated_by", sa.String(64), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("artifact_quotas")
