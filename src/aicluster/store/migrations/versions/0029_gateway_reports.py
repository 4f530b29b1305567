"""Gateways' load reports (store.gateway_reports): one row per gateway process, the
demand it last saw per service, summed by the leader's autoscaler.

Revision ID: 0029_gateway_reports
"""

import sqlalchemy as sa
from alembic import op

revision = "0029_gateway_reports"
down_revision = "0027_list_page_indexes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gateway_reports",
        sa.Column("gateway_id", sa.String(80), primary_key=True),
        sa.Column("reported_at", sa.Float, nullable=False),
        sa.Column("demand", sa.Text, nullable=False),
    )
    op.create_index("ix_gateway_reports_reported_at", "gateway_reports", ["reported_at"])


def downgrade() -> None:
    op.drop_index("ix_gateway_reports_reported_at", table_name="gateway_reports")
    op.drop_table("gateway_reports")
