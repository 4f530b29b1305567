"""Usage over time in the state store: the reads behind `/v1/usage/series` and the
usage metrics.

Vocabulary: a *day* is a UNIX day (floor(t / 86400), UTC), the key of the ledger's
per-team daily sums (store.usage_schema.UsageTeamDailyRow). An *admission* is a job's
transition to ADMITTED; its *queue wait* is the time from the job's last entry into
PENDING (its submission, or a requeue) to that admission, both read from the event log.

Invariants: every figure is read from rows the ledger and the jobs store already keep
(no table of its own, nothing written); the daily sums are exact integers (GPU-ms and
micro-units of cost), summed here without loss; a wait is never negative and an
admission without an earlier PENDING entry (impossible for a job the store wrote) is
left out rather than guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import aliased

from aicluster.core.lifecycle import JobStatus
from aicluster.store.db import Store
from aicluster.store.schema import EventRow
from aicluster.store.usage_schema import UsageTeamDailyRow


@dataclass(frozen=True)
class TeamDay:
    day: int  # UNIX day
    team: str
    gpu_ms: int
    cost_micros: int


@dataclass(frozen=True)
class Admission:
    event_id: int
    ts: float  # when the job was admitted
    team: str
    wait_s: float  # from its last entry into PENDING


class UsageSeriesStore:
    """Shares the engine, session factory and clock of a `Store`."""

    def __init__(self, store: Store):
        self.store = store
        self._session = store._session
        self.clock = store.clock

    def team_days(self, first_day: int, last_day: int, team: str | None = None) -> list[TeamDay]:
        """The per-team daily sums of the days in [first_day, last_day] (of `team`)."""
        T = UsageTeamDailyRow
        q = select(T.day, T.team, T.gpu_ms, T.cost_micros).where(
            T.day >= first_day, T.day <= last_day
        )
        if team is not None:
            q = q.where(T.team == team)
        with self._session() as s:
            return [
                TeamDay(int(d), t, int(g), int(c)) for d, t, g, c in s.execute(q.order_by(T.day))
            ]

    def team_totals(self) -> dict[str, tuple[int, int]]:
        """Every team's (GPU-ms, cost micros) since the ledger began: one row per team."""
        T = UsageTeamDailyRow
        q = select(T.team, func.sum(T.gpu_ms), func.sum(T.cost_micros)).group_by(T.team)
        with self._session() as s:
            return {t: (int(g or 0), int(c or 0)) for t, g, c in s.execute(q)}

    def last_event_id(self) -> int:
        """The newest event's id a cursor may stand on (never past the event horizon)."""
        horizon = self.store.event_horizon()
        with self._session() as s:
            newest = s.scalar(select(func.max(EventRow.id))) or 0
        return newest if horizon is None else min(newest, horizon)

    def admissions(
        self,
        since: float | None = None,
        until: float | None = None,
        team: str | None = None,
        after_id: int = 0,
        limit: int | None = None,
    ) -> list[Admission]:
        """Admissions at [since, until) (of `team`, after event id `after_id`), oldest
        first, each with its queue wait: one query (the PENDING entry it waited from is
        found through the events' object id index)."""
        E, P = EventRow, aliased(EventRow)
        entered = (
            select(func.max(P.ts))
            .where(
                P.object_id == E.object_id,
                P.kind == "job",
                P.to_status == JobStatus.PENDING.value,
                P.id < E.id,
            )
            .scalar_subquery()
        )
        q = select(E.id, E.ts, E.team, entered).where(
            E.kind == "job",
            E.type == "JobTransition",
            E.to_status == JobStatus.ADMITTED.value,
            E.id > after_id,
        )
        if since is not None:
            q = q.where(E.ts >= since)
        if until is not None:
            q = q.where(E.ts < until)
        if team is not None:
            q = q.where(E.team == team)
        horizon = self.store.event_horizon()
        if horizon is not None:
            q = q.where(E.id <= horizon)
        q = q.order_by(E.id)
        if limit is not None:
            q = q.limit(limit)
        with self._session() as s:
            rows = s.execute(q).all()
        return [
            Admission(i, ts, team or "", max(0.0, ts - pending))
            for i, ts, team, pending in rows
            if pending is not None
        ]
