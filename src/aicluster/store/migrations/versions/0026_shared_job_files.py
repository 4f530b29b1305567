"""Working directories and workers' logs in the state store, so that every control-plane
replica (on any machine) launches what any replica accepted and serves every log
(store.jobfiles).

Revision ID: 0026_shared_job_files
"""

import sqlalchemy as sa
from alembic import op

revision = "0026_shared_job_files"
down_revision = "0025_token_usage_limits"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_workdirs",
        sa.Column("ref", sa.String(80), primary_key=True),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "job_log_chunks",
        sa.Column("job_id", sa.String(80), primary_key=True),
        sa.Column("attempt", sa.Integer, primary_key=True),
        sa.Column("rank", sa.Integer, primary_key=True),
        sa.Column("offset", sa.BigInteger, primary_key=True),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("job_log_chunks")
    op.drop_table("job_workdirs")
