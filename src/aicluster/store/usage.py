"""The usage ledger in the state store: lines of ended job attempts and of ended replica
runs (store.usage_replicas), prices, reports.

Invariants: a line is keyed by (job id, attempt) (a replica run's: its workload id, 1), so
accounting twice never counts twice;
the accountant's cursor (the last event id read) moves in the same transaction as the lines
it writes, so a crash leaves neither a gap nor a double count. The accountant reads
the event log no further than the event horizon (JobStore.event_horizon: at or below it every
id is committed or never will be), which lets a cursor be an id on SQLite and PostgreSQL.
Report totals are sums of integer columns: exactly the sum of their lines. The daily sums
(per team, user, pool and GPU model; per team and service; per team alone) are written in
the transaction that writes their lines, so they are always exactly the sums of the lines.
Lost work: the GPU time of job attempts that ended by a RequeueCause in LOST and of replica
runs that ended by a reason in usage_replicas.LOST.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sqlalchemy import and_, case, func, insert, or_, select
from sqlalchemy.orm import Session

from aicluster.core.lifecycle import JobStatus, RequeueCause
from aicluster.store.db import Store
from aicluster.store.jobs import AttemptRecord, EventRecord, JobRecord, attempts_of, fields_of
from aicluster.store.schema import EventRow, JobRow
from aicluster.store.usage_replicas import LOST as REPLICA_LOST
from aicluster.store.usage_replicas import ReplicaLineMaker, account_runs, run_ends
from aicluster.store.usage_schema import (
    PriceRow,
    UsageCursorRow,
    UsageDailyRow,
    UsageLineRow,
    UsageServiceDailyRow,
    UsageTeamDailyRow,
)

CURSOR = "jobs"
BATCH = 500  # jobs read per query by the accountant (an IN list)
# Report groupings: the name a caller uses -> the line's column.
GROUPS = {
    "team": UsageLineRow.team,
    "user": UsageLineRow.user,
    "job": UsageLineRow.job_id,
    "pool": UsageLineRow.pool,
    "gpu_model": UsageLineRow.gpu_model,
    "end_reason": UsageLineRow.end_reason,
    "service": UsageLineRow.service,
    "kind": UsageLineRow.kind,
}
# The groupings the daily sums keep (reports by these over whole days read the sums).
DAILY_GROUPS = {
    "team": UsageDailyRow.team,
    "user": UsageDailyRow.user,
    "pool": UsageDailyRow.pool,
    "gpu_model": UsageDailyRow.gpu_model,
}
# The groupings the per-service daily sums keep (a job's line has service '').
SERVICE_GROUPS = {
    "service": UsageServiceDailyRow.service,
    "kind": case((UsageServiceDailyRow.service == "", "job"), else_="replica"),
}
SUMS = ("lines", "run_ms", "gpu_ms", "cpu_ms", "memory_gib_ms", "lost_gpu_ms", "cost_micros")
DAY = 86400
# Ends that lose work the job did not choose to lose: attributed in reports as `lost`.
LOST = tuple(
    c.value
    for c in (
        RequeueCause.PREEMPTED,
        RequeueCause.NODE_LOST,
        RequeueCause.NODE_UNHEALTHY,
        RequeueCause.NODE_DRAINED,
        RequeueCause.WORKER_LOST,
    )
)
_IN_ATTEMPT = (JobStatus.ADMITTED.value, JobStatus.RUNNING.value)


@dataclass(frozen=True)
class PriceRecord:
    id: int
    pool: str | None
    gpu_model: str | None
    gpu_hour: float | None
    cpu_hour: float | None
    memory_gib_hour: float | None
    storage_gib_month: float | None
    effective_from: float
    created_at: float
    actor: str | None

    @classmethod
    def of(cls, row: PriceRow) -> PriceRecord:
        return cls(**fields_of(cls, row))


@dataclass(frozen=True)
class UsageLine:
    id: int
    job_id: str
    attempt: int
    kind: str  # job | replica
    service: str | None
    team: str
    user: str
    pool: str | None
    gpu_model: str | None
    nodes: list
    workers: int
    gpus: int
    cpus: float
    memory: int
    admitted_at: float
    started_at: float | None
    ended_at: float
    end_reason: str | None
    run_ms: int
    gpu_ms: int
    cpu_ms: int
    memory_gib_ms: int
    gpu_hour: float
    cpu_hour: float
    memory_gib_hour: float
    price_source: str
    cost_micros: int
    accounted_at: float

    @classmethod
    def of(cls, row: UsageLineRow) -> UsageLine:
        return cls(**fields_of(cls, row))


@dataclass(frozen=True)
class UsageTotal:
    """The sum of a group of lines (`key` None for the grand total)."""

    key: str | None
    lines: int
    run_ms: int
    gpu_ms: int
    cpu_ms: int
    memory_gib_ms: int
    lost_gpu_ms: int  # of attempts and replicas preempted or lost with their node or worker
    cost_micros: int


# make_line(job, attempt, prices) -> the new line's columns (no id, key or accounted_at)
LineMaker = Callable[[JobRecord, AttemptRecord, list[PriceRecord]], dict]


class UsageStore:
    """Shares the engine, session factory and clock of a `Store`."""

    def __init__(self, store: Store):
        self.store = store
        self._session = store._session
        self.clock = store.clock

    # -- prices -----------------------------------------------------------------------

    def set_price(
        self,
        pool: str | None,
        gpu_model: str | None,
        rates: dict[str, float | None],
        effective_from: float,
        actor: str | None = None,
    ) -> PriceRecord:
        """The rate card of a scope from `effective_from` on; the same scope and time
        again replaces it."""
        with self._session.begin() as s:
            row = s.scalars(
                select(PriceRow).where(
                    PriceRow.pool.is_(None) if pool is None else PriceRow.pool == pool,
                    PriceRow.gpu_model.is_(None)
                    if gpu_model is None
                    else PriceRow.gpu_model == gpu_model,
                    PriceRow.effective_from == effective_from,
                )
            ).first() or PriceRow(pool=pool, gpu_model=gpu_model, effective_from=effective_from)
            for name in ("gpu_hour", "cpu_hour", "memory_gib_hour", "storage_gib_month"):
                setattr(row, name, rates.get(name))
            row.created_at, row.actor = self.clock(), actor
            s.add(row)
            s.flush()
            scope = f"pool {pool or '*'}, GPU model {gpu_model or '*'}"
            set_ = ", ".join(f"{k} {v:g}" for k, v in rates.items() if v is not None)
            self.store._event(
                s, "price", str(row.id), None, "PriceSet", message=f"{scope}: {set_}", actor=actor
            )
            return PriceRecord.of(row)

    def prices(self) -> list[PriceRecord]:
        with self._session() as s:
            return [PriceRecord.of(r) for r in s.scalars(select(PriceRow).order_by(PriceRow.id))]

    # -- accounting -------------------------------------------------------------------

    def cursor(self) -> int:
        with self._session() as s:
            row = s.get(UsageCursorRow, CURSOR)
            return row.event_id if row else 0

    def account(
        self,
        make_line: LineMaker,
        limit: int = 2000,
        make_replica_line: ReplicaLineMaker | None = None,
    ) -> int:
        """Read up to `limit` events after the cursor; write a line for every ended attempt
        of the jobs whose attempts ended there and for every replica run that ended there,
        that has none yet; move the cursor. One transaction. Returns the number of lines
        written."""
        horizon = self.store.event_horizon()
        with self._session.begin() as s:
            cur = s.get(UsageCursorRow, CURSOR)
            after = cur.event_id if cur is not None else 0
            below = [EventRow.id <= horizon] if horizon is not None else []
            rows = s.execute(
                select(
                    EventRow.id,
                    EventRow.kind,
                    EventRow.object_id,
                    EventRow.type,
                    EventRow.from_status,
                    EventRow.to_status,
                    EventRow.ts,
                    EventRow.reason,
                )
                .where(EventRow.id > after, *below)
                .order_by(EventRow.id)
                .limit(limit)
            ).all()
            if not rows:
                return 0
            ended = dict.fromkeys(
                r.object_id
                for r in rows
                if r.kind == "job"
                and r.type == "JobTransition"
                and r.from_status in _IN_ATTEMPT
                and r.to_status != JobStatus.RUNNING.value
            )
            runs = run_ends(rows)
            if runs and make_replica_line is None:
                raise ValueError("replica runs ended: account() needs make_replica_line")
            prices = []
            if ended or runs:
                prices = [PriceRecord.of(p) for p in s.scalars(select(PriceRow))]
            new: list[dict] = []
            ids = list(ended)
            for i in range(0, len(ids), BATCH):
                new += self._account_jobs(s, ids[i : i + BATCH], make_line, prices)
            rids = list(runs)
            for i in range(0, len(rids), BATCH):
                part = {r: runs[r] for r in rids[i : i + BATCH]}
                new += account_runs(s, part, make_replica_line, prices)
            if new:
                now = self.clock()
                s.execute(insert(UsageLineRow), [dict(x, accounted_at=now) for x in new])
            self._add_daily(s, new)
            if cur is None:
                cur = UsageCursorRow(name=CURSOR)
                s.add(cur)
            cur.event_id, cur.updated_at = rows[-1].id, self.clock()
            return len(new)

    def _account_jobs(
        self, s: Session, job_ids: list[str], make_line: LineMaker, prices
    ) -> list[dict]:
        """The new lines of these jobs: one per ended attempt that has none yet (three
        queries for the batch, not three per job)."""
        jobs = {r.id: r for r in s.scalars(select(JobRow).where(JobRow.id.in_(job_ids)))}
        done: dict[str, set[int]] = {j: set() for j in job_ids}
        for job_id, attempt in s.execute(
            select(UsageLineRow.job_id, UsageLineRow.attempt).where(
                UsageLineRow.job_id.in_(job_ids)
            )
        ):
            done[job_id].add(attempt)
        events: dict[str, list[EventRecord]] = {j: [] for j in job_ids}
        for e in s.scalars(
            select(EventRow)
            .where(
                EventRow.kind == "job",
                EventRow.object_id.in_(job_ids),
                EventRow.type == "JobTransition",
            )
            .order_by(EventRow.id)
        ):
            events[e.object_id].append(EventRecord.of(e))
        new = []
        for job_id in job_ids:
            if job_id not in jobs:
                continue
            job = JobRecord.of(jobs[job_id])
            for a in attempts_of(events[job_id]):
                if a.ended_at is None or a.attempt in done[job_id]:
                    continue
                line = dict(make_line(job, a, prices), job_id=job_id, attempt=a.attempt)
                new.append(dict(line, kind="job", service=None))
                done[job_id].add(a.attempt)
        return new

    def _add_daily(self, s: Session, lines: list[dict]) -> None:
        """Add `lines` to the daily sums, both kinds (in the transaction that writes them)."""
        fine: dict[tuple, list[int]] = {}
        by_team: dict[tuple, list[int]] = {}
        by_service: dict[tuple, list[int]] = {}
        for x in lines:
            day = math.floor(x["ended_at"] / DAY)
            lost = x["gpu_ms"] if is_lost(x.get("kind", "job"), x["end_reason"]) else 0
            values = (1, x["run_ms"], x["gpu_ms"], x["cpu_ms"], x["memory_gib_ms"], lost)
            values = (*values, x["cost_micros"])
            key = (day, x["team"], x["user"], x["pool"] or "", x["gpu_model"] or "")
            service = (day, x["team"], x.get("service") or "")
            for acc, k in ((fine, key), (by_team, key[:2]), (by_service, service)):
                sums = acc.setdefault(k, [0] * len(SUMS))
                for i, v in enumerate(values):
                    sums[i] += v
        _add_sums(s, UsageDailyRow, ("day", "team", "user", "pool", "gpu_model"), fine)
        _add_sums(s, UsageTeamDailyRow, ("day", "team"), by_team)
        _add_sums(s, UsageServiceDailyRow, ("day", "team", "service"), by_service)

    # -- reports ----------------------------------------------------------------------

    def _where(self, since: float | None, until: float | None, team: str | None) -> list:
        where = []
        if since is not None:
            where.append(UsageLineRow.ended_at >= since)
        if until is not None:
            where.append(UsageLineRow.ended_at < until)
        if team is not None:
            where.append(UsageLineRow.team == team)
        return where

    def totals(
        self,
        by: str | None,
        since: float | None = None,
        until: float | None = None,
        team: str | None = None,
    ) -> list[UsageTotal]:
        """Sums of the lines that ended in [since, until) (of `team`), one per value of the
        `by` column (GROUPS), biggest cost first; by None: the grand total alone. Without
        `until`, whole UTC days come from the daily sums (by team or in all: the team's
        daily sums; by service or kind: the per-service ones) and only the lines of the
        first, partial day are read (from the index that covers their sums); the figures
        are the same integers either way."""
        daily = by is None or by in DAILY_GROUPS or by in SERVICE_GROUPS
        if until is not None or not daily:
            return _ordered(_merged(self._line_totals(by, since, until, team), by))
        first_day = None if since is None else math.ceil(since / DAY)
        if by in (None, "team"):
            parts = self._team_daily_totals(by, first_day, team)
        elif by in SERVICE_GROUPS:
            parts = self._service_daily_totals(by, first_day, team)
        else:
            parts = self._daily_totals(by, first_day, team)
        if since is not None:
            parts += self._line_totals(by, since, first_day * DAY, team)
        return _ordered(_merged(parts, by))

    def _team_daily_totals(self, by, first_day: int | None, team: str | None) -> list[tuple]:
        T = UsageTeamDailyRow
        where = [] if first_day is None else [T.day >= first_day]
        if team is not None:
            where.append(T.team == team)
        sums = tuple(func.sum(getattr(T, n)) for n in SUMS)
        return self._grouped(T.team if by == "team" else None, sums, where)

    def _line_totals(self, by, since, until, team) -> list[tuple]:
        L = UsageLineRow
        lost = case((_lost_sql(), L.gpu_ms), else_=0)
        cols = (L.run_ms, L.gpu_ms, L.cpu_ms, L.memory_gib_ms, lost, L.cost_micros)
        return self._grouped(
            GROUPS.get(by), (func.count(), *map(func.sum, cols)), (self._where(since, until, team))
        )

    def _daily_totals(self, by, first_day: int | None, team: str | None) -> list[tuple]:
        D = UsageDailyRow
        where = [] if first_day is None else [D.day >= first_day]
        if team is not None:
            where.append(D.team == team)
        sums = tuple(func.sum(getattr(D, n)) for n in SUMS)
        rows = self._grouped(DAILY_GROUPS.get(by), sums, where)
        if by in ("pool", "gpu_model"):  # stored as '' when there is none
            rows = [(r[0] or None, *r[1:]) for r in rows]
        return rows

    def _service_daily_totals(self, by, first_day: int | None, team: str | None) -> list[tuple]:
        D = UsageServiceDailyRow
        where = [] if first_day is None else [D.day >= first_day]
        if team is not None:
            where.append(D.team == team)
        sums = tuple(func.sum(getattr(D, n)) for n in SUMS)
        rows = self._grouped(SERVICE_GROUPS[by], sums, where)
        if by == "service":  # stored as '' for jobs
            rows = [(r[0] or None, *r[1:]) for r in rows]
        return rows

    def _grouped(self, key, sums: tuple, where: list) -> list[tuple]:
        """(key, *sums) rows; key None for an ungrouped sum."""
        q = select(*((key,) if key is not None else ()), *sums).where(*where)
        if key is not None:
            q = q.group_by(key)
        with self._session() as s:
            rows = s.execute(q).all()
        return [tuple(r) if key is not None else (None, *r) for r in rows]

    def lines(
        self,
        since: float | None = None,
        until: float | None = None,
        team: str | None = None,
        limit: int = 1000,
        after_id: int = 0,
    ) -> list[UsageLine]:
        q = (
            select(UsageLineRow)
            .where(UsageLineRow.id > after_id, *self._where(since, until, team))
            .order_by(UsageLineRow.id)
            .limit(limit)
        )
        with self._session() as s:
            return [UsageLine.of(r) for r in s.scalars(q)]

    def add_lines(self, lines: Iterable[dict]) -> None:
        """Write lines as given, with their daily sums (the benchmark's synthetic ledger)."""
        lines = list(lines)
        with self._session.begin() as s:
            s.execute(UsageLineRow.__table__.insert(), lines)
            self._add_daily(s, lines)


def is_lost(kind: str, end_reason: str | None) -> bool:
    """Whether a line's end lost work it did not choose to lose (its GPU time is `lost`)."""
    return end_reason in (REPLICA_LOST if kind == "replica" else LOST)


def _lost_sql():
    L = UsageLineRow
    return or_(
        and_(L.kind != "replica", L.end_reason.in_(LOST)),
        and_(L.kind == "replica", L.end_reason.in_(REPLICA_LOST)),
    )


def grand_total(groups: list[UsageTotal]) -> UsageTotal:
    """The total of every group of a grouping (each line is in exactly one group)."""
    sums = [sum(getattr(g, n) for g in groups) for n in SUMS]
    return UsageTotal(None, *sums)


def _add_sums(s: Session, Row, keys: tuple[str, ...], acc: dict[tuple, list[int]]) -> None:
    """Add `acc` (key values -> SUMS) to the sum rows `Row` keyed by the columns `keys`."""
    if not acc:
        return
    have = {
        tuple(getattr(r, k) for k in keys): r
        for r in s.scalars(
            select(Row).where(Row.day.in_({k[0] for k in acc}), Row.team.in_({k[1] for k in acc}))
        )
    }
    for key, sums in acc.items():
        row = have.get(key)
        if row is None:
            row = Row(**dict(zip(keys, key, strict=True)), **dict.fromkeys(SUMS, 0))
            s.add(row)
        for name, v in zip(SUMS, sums, strict=True):
            setattr(row, name, getattr(row, name) + v)


def _merged(parts: list[tuple], by: str | None) -> list[UsageTotal]:
    acc: dict = {} if by is not None else {None: [0] * len(SUMS)}
    for key, *values in parts:
        sums = acc.setdefault(key, [0] * len(SUMS))
        for i, v in enumerate(values):
            sums[i] += int(v or 0)
    return [UsageTotal(key, *sums) for key, sums in acc.items()]


def _ordered(totals: list[UsageTotal]) -> list[UsageTotal]:
    return sorted(totals, key=lambda t: (-t.cost_micros, -t.gpu_ms, str(t.key)))
