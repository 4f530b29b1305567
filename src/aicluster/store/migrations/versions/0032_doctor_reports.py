"""Reports of `aicluster doctor` runs (store.doctor): one row per judged doctor job, its
verdict, the nodes it measured and failed, and the whole report as JSON.

Revision ID: 0032_doctor_reports
"""

import sqlalchemy as sa
from alembic import op

revision = "0032_doctor_reports"
down_revision = "0031_token_usage_limited"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "doctor_reports",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("created_by", sa.String(255), nullable=False),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("nodes", sa.Text, nullable=False),
        sa.Column("failing", sa.Text, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
    )
    op.create_index("ix_doctor_reports_created_at", "doctor_reports", ["created_at"])
    op.create_index("ix_doctor_reports_job_id", "doctor_reports", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_doctor_reports_job_id", table_name="doctor_reports")
    op.drop_index("ix_doctor_reports_created_at", table_name="doctor_reports")
    op.drop_table("doctor_reports")
