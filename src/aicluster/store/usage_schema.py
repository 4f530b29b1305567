"""Tables of the usage ledger: one line per ended job attempt and per ended replica run
(`kind`), its daily sums (per team, user, pool and GPU model; per team and service; per
team alone), the prices admins set, the accountant's cursor over the event log, the facts
of each replica run recorded when it is placed, and the daily storage samples per team.

Quantities are integers so that every total is the exact sum of its lines: milliseconds
of run time, GPU-, CPU- and memory-GiB-milliseconds, and cost in micro-units of the
price's currency (micro-USD for the catalog's defaults).
"""

from __future__ import annotations

from sqlalchemy import JSON, BigInteger, Float, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from aicluster.store.schema import Base

# The columns of the covering index a range report reads (ended_at first).
LINE_SUMS = (
    "ended_at",
    "team",
    "end_reason",
    "kind",
    "service",
    "run_ms",
    "gpu_ms",
    "cpu_ms",
    "memory_gib_ms",
    "cost_micros",
)


class UsageLineRow(Base):
    """A job attempt's line is keyed by (job id, attempt); a replica run's by (`replica:`
    + replica id, 1): a replica id names one run on one node (core.replica)."""

    __tablename__ = "usage_lines"
    __table_args__ = (
        UniqueConstraint("job_id", "attempt", name="uq_usage_lines_job_attempt"),
        Index("ix_usage_lines_team_ended", "team", "ended_at"),
        # Covers a report's sums over a time range (the first, partial day of a window):
        # read from the index alone, never from the lines' rows.
        Index("ix_usage_lines_ended_sums", *LINE_SUMS),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(80))  # replicas: their workload id
    attempt: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(8), default="job", server_default="job")
    service: Mapped[str | None] = mapped_column(String(64), nullable=True)  # replicas'
    team: Mapped[str] = mapped_column(String(64))
    user: Mapped[str] = mapped_column(String(64))
    pool: Mapped[str | None] = mapped_column(String(64), nullable=True)
    gpu_model: Mapped[str | None] = mapped_column(String(128), nullable=True)
    nodes: Mapped[list] = mapped_column(JSON)  # node id per rank
    workers: Mapped[int] = mapped_column(Integer)
    gpus: Mapped[int] = mapped_column(Integer)  # all workers together
    cpus: Mapped[float] = mapped_column(Float)
    memory: Mapped[int] = mapped_column(BigInteger)  # bytes
    admitted_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)  # None: never ran
    ended_at: Mapped[float] = mapped_column(Float)
    end_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    run_ms: Mapped[int] = mapped_column(BigInteger)
    gpu_ms: Mapped[int] = mapped_column(BigInteger)
    cpu_ms: Mapped[int] = mapped_column(BigInteger)
    memory_gib_ms: Mapped[int] = mapped_column(BigInteger)
    # The rates in force at the start (per hour) and where they came from: set | catalog | none
    gpu_hour: Mapped[float] = mapped_column(Float)
    cpu_hour: Mapped[float] = mapped_column(Float)
    memory_gib_hour: Mapped[float] = mapped_column(Float)
    price_source: Mapped[str] = mapped_column(String(16))
    cost_micros: Mapped[int] = mapped_column(BigInteger)
    accounted_at: Mapped[float] = mapped_column(Float)


class DaySums:
    """The columns every table of daily sums has: its UTC day, the team, and the sums of
    its lines (SUMS in store.usage), each the exact total of integer line quantities."""

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    day: Mapped[int] = mapped_column(Integer)  # UNIX days: floor(ended_at / 86400)
    team: Mapped[str] = mapped_column(String(64))
    lines: Mapped[int] = mapped_column(BigInteger)
    run_ms: Mapped[int] = mapped_column(BigInteger)
    gpu_ms: Mapped[int] = mapped_column(BigInteger)
    cpu_ms: Mapped[int] = mapped_column(BigInteger)
    memory_gib_ms: Mapped[int] = mapped_column(BigInteger)
    lost_gpu_ms: Mapped[int] = mapped_column(BigInteger)
    cost_micros: Mapped[int] = mapped_column(BigInteger)


class UsageDailyRow(DaySums, Base):
    """The lines of a UTC day summed per (team, user, pool, GPU model), written with the
    lines: reports over whole days read these instead of every line. No pool or GPU model
    is stored as ''."""

    __tablename__ = "usage_daily"
    __table_args__ = (
        UniqueConstraint("day", "team", "user", "pool", "gpu_model", name="uq_usage_daily_key"),
    )
    user: Mapped[str] = mapped_column(String(64))
    pool: Mapped[str] = mapped_column(String(64))
    gpu_model: Mapped[str] = mapped_column(String(128))


class UsageTeamDailyRow(DaySums, Base):
    """The lines of a UTC day summed per team, written with the lines (and with
    `usage_daily`): reports by team, and grand totals, over whole days read these: some
    one row a day per team instead of one per (team, user, pool, GPU model)."""

    __tablename__ = "usage_team_daily"
    __table_args__ = (UniqueConstraint("day", "team", name="uq_usage_team_daily_key"),)


class UsageServiceDailyRow(DaySums, Base):
    """The lines of a UTC day summed per (team, service), written with the lines: reports
    by service (or kind) over whole days read these. Job lines are stored as service ''."""

    __tablename__ = "usage_service_daily"
    __table_args__ = (
        UniqueConstraint("day", "team", "service", name="uq_usage_service_daily_key"),
    )
    service: Mapped[str] = mapped_column(String(64))


class UsageReplicaRunRow(Base):
    """What a replica held from its placement on, recorded in the transaction that
    places it (store.services): its ledger line is made from this and its end event, even
    after its service and replica rows are gone."""

    __tablename__ = "usage_replica_runs"
    replica_id: Mapped[str] = mapped_column(String(96), primary_key=True)
    service: Mapped[str] = mapped_column(String(64))
    team: Mapped[str] = mapped_column(String(64))
    user: Mapped[str] = mapped_column(String(64))  # who deployed the service
    node_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    gpus: Mapped[int] = mapped_column(Integer)
    cpus: Mapped[float] = mapped_column(Float)
    memory: Mapped[int] = mapped_column(BigInteger)  # bytes
    gpu_model: Mapped[str | None] = mapped_column(String(128), nullable=True)  # the spec's
    placed_at: Mapped[float] = mapped_column(Float)


class StorageSampleRow(Base):
    """Bytes a team stores, of one kind (artifacts, checkpoints, logs), sampled once a
    UTC day: one row per (day, team, kind), a later sample of the day replaces it."""

    __tablename__ = "usage_storage"
    __table_args__ = (UniqueConstraint("day", "team", "kind", name="uq_usage_storage_key"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    day: Mapped[int] = mapped_column(Integer)  # UNIX days
    team: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16))
    bytes: Mapped[int] = mapped_column(BigInteger)
    sampled_at: Mapped[float] = mapped_column(Float)


class PriceRow(Base):
    """A rate card for a scope (pool and/or GPU model; both None: everything) from
    `effective_from` on; a rate left None falls back to a wider scope."""

    __tablename__ = "prices"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    pool: Mapped[str | None] = mapped_column(String(64), nullable=True)
    gpu_model: Mapped[str | None] = mapped_column(String(128), nullable=True)
    gpu_hour: Mapped[float | None] = mapped_column(Float, nullable=True)
    cpu_hour: Mapped[float | None] = mapped_column(Float, nullable=True)
    memory_gib_hour: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Token rates per million prompt (input) and completion (output) tokens, of `service`
    # (TEAM/NAME or NAME; None: every service): store.token_usage.
    service: Mapped[str | None] = mapped_column(String(128), nullable=True)
    input_mtok: Mapped[float | None] = mapped_column(Float, nullable=True)
    output_mtok: Mapped[float | None] = mapped_column(Float, nullable=True)
    storage_gib_month: Mapped[float | None] = mapped_column(Float, nullable=True)
    effective_from: Mapped[float] = mapped_column(Float)
    created_at: Mapped[float] = mapped_column(Float)
    actor: Mapped[str | None] = mapped_column(String(64), nullable=True)


class UsageCursorRow(Base):
    """How far the accountant has read the event log (the last event id it consumed)."""

    __tablename__ = "usage_cursor"
    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    event_id: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[float] = mapped_column(Float)
