"""The usage ledger: one line per ended job attempt and their daily sums, prices with an
effective-from time, and the accountant's cursor over the event log.

Revision ID: 0014_usage_ledger
"""

import sqlalchemy as sa
from alembic import op

revision = "0014_usage_ledger"
down_revision = "0013_event_interrupted_at"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "usage_lines",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(80), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("team", sa.String(64), nullable=False),
        sa.Column("user", sa.String(64), nullable=False),
        sa.Column("pool", sa.String(64), nullable=True),
        sa.Column("gpu_model", sa.String(128), nullable=True),
        sa.Column("nodes", sa.JSON, nullable=False),
        sa.Column("workers", sa.Integer, nullable=False),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("cpus", sa.Float, nullable=False),
        sa.Column("memory", sa.BigInteger, nullable=False),
        sa.Column("admitted_at", sa.Float, nullable=False),
        sa.Column("started_at", sa.Float, nullable=True),
        sa.Column("ended_at", sa.Float, nullable=False),
        sa.Column("end_reason", sa.String(32), nullable=True),
        sa.Column("run_ms", sa.BigInteger, nullable=False),
        sa.Column("gpu_ms", sa.BigInteger, nullable=False),
        sa.Column("cpu_ms", sa.BigInteger, nullable=False),
        sa.Column("memory_gib_ms", sa.BigInteger, nullable=False),
        sa.Column("gpu_hour", sa.Float, nullable=False),
        sa.Column("cpu_hour", sa.Float, nullable=False),
        sa.Column("memory_gib_hour", sa.Float, nullable=False),
        sa.Column("price_source", sa.String(16), nullable=False),
        sa.Column("cost_micros", sa.BigInteger, nullable=False),
        sa.Column("accounted_at", sa.Float, nullable=False),
        sa.UniqueConstraint("job_id", "attempt", name="uq_usage_lines_job_attempt"),
    )
    op.create_index("ix_usage_lines_team_ended", "usage_lines", ["team", "ended_at"])
    op.create_index("ix_usage_lines_ended_at", "usage_lines", ["ended_at"])
    op.create_table(
        "usage_daily",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("day", sa.Integer, nullable=False),
        sa.Column("team", sa.String(64), nullable=False),
        sa.Column("user", sa.String(64), nullable=False),
        sa.Column("pool", sa.String(64), nullable=False),
        sa.Column("gpu_model", sa.String(128), nullable=False),
        *(
            sa.Column(name, sa.BigInteger, nullable=False)
            for name in (
                "lines",
                "run_ms",
                "gpu_ms",
                "cpu_ms",
                "memory_gib_ms",
                "lost_gpu_ms",
                "cost_micros",
            )
        ),
        sa.UniqueConstraint("day", "team", "user", "pool", "gpu_model", name="uq_usage_daily_key"),
    )
    op.create_table(
        "prices",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("pool", sa.String(64), nullable=True),
        sa.Column("gpu_model", sa.String(128), nullable=True),
        sa.Column("gpu_hour", sa.Float, nullable=True),
        sa.Column("cpu_hour", sa.Float, nullable=True),
        sa.Column("memory_gib_hour", sa.Float, nullable=True),
        sa.Column("effective_from", sa.Float, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("actor", sa.String(64), nullable=True),
    )
    op.create_table(
        "usage_cursor",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("event_id", sa.Integer, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("usage_cursor")
    op.drop_table("prices")
    op.drop_table("usage_daily")
    op.drop_index("ix_usage_lines_ended_at", "usage_lines")
    op.drop_index("ix_usage_lines_team_ended", "usage_lines")
    op.drop_table("usage_lines")
