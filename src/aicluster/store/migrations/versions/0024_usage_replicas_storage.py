"""Usage ledger of replicas and storage (store.usage, store.usage_replicas,
store.usage_storage): lines get a kind (job | replica) and a service; daily sums per team
and service (filled from the per-team sums: every line so far is a job's); the facts of
each replica run, recorded at its placement (filled for the replicas placed now); daily
storage samples per team; a storage price per GiB-month.

Revision ID: 0024_usage_replicas_storage
"""

import json

import sqlalchemy as sa
from alembic import op

revision = "0024_usage_replicas_storage"
down_revision = "0023_team_budgets"
branch_labels = None
depends_on = None

SUMS = ("lines", "run_ms", "gpu_ms", "cpu_ms", "memory_gib_ms", "lost_gpu_ms", "cost_micros")
OLD_LINE_SUMS = (
    "ended_at",
    "team",
    "end_reason",
    "run_ms",
    "gpu_ms",
    "cpu_ms",
    "memory_gib_ms",
    "cost_micros",
)
LINE_SUMS = (*OLD_LINE_SUMS[:3], "kind", "service", *OLD_LINE_SUMS[3:])


def upgrade() -> None:
    with op.batch_alter_table("usage_lines") as batch:
        batch.add_column(sa.Column("kind", sa.String(8), nullable=False, server_default="job"))
        batch.add_column(sa.Column("service", sa.String(64), nullable=True))
    op.drop_index("ix_usage_lines_ended_sums", table_name="usage_lines")
    op.create_index("ix_usage_lines_ended_sums", "usage_lines", list(LINE_SUMS))
    op.create_table(
        "usage_service_daily",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("day", sa.Integer, nullable=False),
        sa.Column("team", sa.String(64), nullable=False),
        sa.Column("service", sa.String(64), nullable=False),
        *(sa.Column(name, sa.BigInteger, nullable=False) for name in SUMS),
        sa.UniqueConstraint("day", "team", "service", name="uq_usage_service_daily_key"),
    )
    sums = ", ".join(SUMS)
    op.execute(
        f"INSERT INTO usage_service_daily (day, team, service, {sums}) "
        f"SELECT day, team, '', {sums} FROM usage_team_daily"
    )
    runs = op.create_table(
        "usage_replica_runs",
        sa.Column("replica_id", sa.String(96), primary_key=True),
        sa.Column("service", sa.String(64), nullable=False),
        sa.Column("team", sa.String(64), nullable=False),
        sa.Column("user", sa.String(64), nullable=False),
        sa.Column("node_id", sa.String(64), nullable=True),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("cpus", sa.Float, nullable=False),
        sa.Column("memory", sa.BigInteger, nullable=False),
        sa.Column("gpu_model", sa.String(128), nullable=True),
        sa.Column("placed_at", sa.Float, nullable=False),
    )
    op.create_table(
        "usage_storage",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("day", sa.Integer, nullable=False),
        sa.Column("team", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("sampled_at", sa.Float, nullable=False),
        sa.UniqueConstraint("day", "team", "kind", name="uq_usage_storage_key"),
    )
    with op.batch_alter_table("prices") as batch:
        batch.add_column(sa.Column("storage_gib_month", sa.Float, nullable=True))
    _fill_runs(runs)


def _fill_runs(runs: sa.Table) -> None:
    """The runs of the replicas placed now (STARTING or READY): their lines will be made
    when they stop, from what their service's spec asks of each replica."""
    conn = op.get_bind()
    meta = sa.MetaData()
    replicas = sa.Table("replicas", meta, autoload_with=conn)
    services = sa.Table("services", meta, autoload_with=conn)
    events = sa.Table("events", meta, autoload_with=conn)
    q = sa.select(
        replicas.c.id,
        replicas.c.team,
        replicas.c.node_id,
        replicas.c.created_at,
        services.c.name,
        services.c.owner,
        services.c.spec,
    ).where(
        replicas.c.service_seq == services.c.seq,
        replicas.c.status.in_(("STARTING", "READY")),
    )
    rows = []
    for r in conn.execute(q):
        placed = conn.scalar(
            sa.select(sa.func.max(events.c.ts)).where(
                events.c.kind == "replica",
                events.c.object_id == r.id,
                events.c.to_status == "STARTING",
            )
        )
        spec = json.loads(r.spec) if isinstance(r.spec, str) else (r.spec or {})
        res = spec.get("resources") or {}
        rows.append(
            dict(
                replica_id=r.id,
                service=r.name,
                team=r.team,
                user=r.owner,
                node_id=r.node_id,
                gpus=int(res.get("gpus") or 0),
                cpus=float(res.get("cpus") if res.get("cpus") is not None else 1.0),
                memory=int(res.get("memory") or 0),
                gpu_model=res.get("gpu_model"),
                placed_at=placed if placed is not None else r.created_at,
            )
        )
    if rows:
        conn.execute(runs.insert(), rows)


def downgrade() -> None:
    with op.batch_alter_table("prices") as batch:
        batch.drop_column("storage_gib_month")
    op.drop_table("usage_storage")
    op.drop_table("usage_replica_runs")
    op.drop_table("usage_service_daily")
    op.drop_index("ix_usage_lines_ended_sums", table_name="usage_lines")
    op.create_index("ix_usage_lines_ended_sums", "usage_lines", list(OLD_LINE_SUMS))
    with op.batch_alter_table("usage_lines") as batch:
        batch.drop_column("service")
        batch.drop_column("kind")
