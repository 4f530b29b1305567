"""The audit log: one row per audited API call (store.audit).

Revision ID: 0021_audit_log
"""

import sqlalchemy as sa
from alembic import op

revision = "0021_audit_log"
down_revision = "0018_leader_lease"  # the lead relinks the chain after 0019-0020 on merging
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("ts", sa.Float, nullable=False),
        sa.Column("user", sa.String(64), nullable=True),
        sa.Column("role", sa.String(16), nullable=True),
        sa.Column("team", sa.String(64), nullable=True),
        sa.Column("job_id", sa.String(80), nullable=True),
        sa.Column("method", sa.String(8), nullable=False),
        sa.Column("route", sa.String(256), nullable=False),
        sa.Column("target", sa.String(512), nullable=True),
        sa.Column("status", sa.Integer, nullable=False),
        sa.Column("source", sa.String(64), nullable=True),
    )
    op.create_index("ix_audit_log_ts", "audit_log", ["ts"])
    op.create_index("ix_audit_log_user_id", "audit_log", ["user", "id"])


def downgrade() -> None:
    op.drop_index("ix_audit_log_user_id", table_name="audit_log")
    op.drop_index("ix_audit_log_ts", table_name="audit_log")
    op.drop_table("audit_log")
