"""Token lifecycle: when a token last authenticated and when it was revoked
(store.identity). Usage reports by team: daily sums per team (filled from the daily sums
already kept), and the lines' time index widened to cover a report's sums (store.usage).

Revision ID: 0022_tokens_team_sums
"""

import sqlalchemy as sa
from alembic import op

revision = "0022_tokens_team_sums"
down_revision = "0021_audit_log"
branch_labels = None
depends_on = None

SUMS = ("lines", "run_ms", "gpu_ms", "cpu_ms", "memory_gib_ms", "lost_gpu_ms", "cost_micros")
LINE_SUMS = (
    "ended_at",
    "team",
    "end_reason",
    "run_ms",
    "gpu_ms",
    "cpu_ms",
    "memory_gib_ms",
    "cost_micros",
)


def upgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        batch.add_column(sa.Column("last_used_at", sa.Float, nullable=True))
        batch.add_column(sa.Column("revoked_at", sa.Float, nullable=True))
    op.create_table(
        "usage_team_daily",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("day", sa.Integer, nullable=False),
        sa.Column("team", sa.String(64), nullable=False),
        *(sa.Column(name, sa.BigInteger, nullable=False) for name in SUMS),
        sa.UniqueConstraint("day", "team", name="uq_usage_team_daily_key"),
    )
    sums = ", ".join(SUMS)
    op.execute(
        f"INSERT INTO usage_team_daily (day, team, {sums}) "
        f"SELECT day, team, {', '.join(f'sum({n})' for n in SUMS)} "
        "FROM usage_daily GROUP BY day, team"
    )
    op.drop_index("ix_usage_lines_ended_at", table_name="usage_lines")
    op.create_index("ix_usage_lines_ended_sums", "usage_lines", list(LINE_SUMS))


def downgrade() -> None:
    op.drop_index("ix_usage_lines_ended_sums", table_name="usage_lines")
    op.create_index("ix_usage_lines_ended_at", "usage_lines", ["ended_at"])
    op.drop_table("usage_team_daily")
    with op.batch_alter_table("tokens") as batch:
        batch.drop_column("revoked_at")
        batch.drop_column("last_used_at")
