"""The audit log in the state store: who did what through the API, with what outcome.

Vocabulary: an *entry* is one audited API call (store.audit_schema.AuditRow): its caller
(user, role, team, the job of a job's token), the route's template and its *target* (the
objects the call named), the HTTP status it was answered with, the client's address and
the time. *Retention*: how long entries are kept; older ones are pruned.

Invariants: the log is append-only: entries are added and, past the retention, deleted
oldest first in bounded batches, never changed. No entry holds an API token: `append`
masks anything shaped like one (TOKEN_PREFIX and what follows it) whatever the caller
passed, and callers pass no request body. A reader paging by id (`after`) never skips an
entry: it reads no further than the horizon, below which every id is committed.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

from sqlalchemy import delete, func, select, text

from aicluster.store.audit_schema import AuditRow
from aicluster.store.db import Store
from aicluster.store.identity import TOKEN_PREFIX
from aicluster.store.jobs import fields_of

DAY = 86400.0
DEFAULT_RETENTION_S = 365 * DAY
PRUNE_EVERY_S = 600.0  # at most one pruning batch per this long, per process
PRUNE_BATCH = 1000
MASK = TOKEN_PREFIX + "***"
_TOKENISH = re.compile(re.escape(TOKEN_PREFIX) + r"[A-Za-z0-9_\-]*")
_LIMITS = {"user": 64, "role": 16, "team": 64, "job_id": 80, "method": 8, "route": 256}
_LIMITS.update(target=512, source=64)


def mask_tokens(value: str | None) -> str | None:
    """`value` with every token-shaped run replaced by MASK."""
    return None if value is None else _TOKENISH.sub(MASK, value)


@dataclass(frozen=True)
class AuditEntry:
    id: int
    ts: float
    user: str | None
    role: str | None
    team: str | None
    job_id: str | None
    method: str
    route: str
    target: str | None
    status: int
    source: str | None

    @classmethod
    def of(cls, row: AuditRow) -> AuditEntry:
        return cls(**fields_of(cls, row))


class AuditStore:
    """Shares the engine, session factory and clock of a `Store`. `retention_s` None keeps
    every entry."""

    def __init__(
        self,
        store: Store,
        retention_s: float | None = DEFAULT_RETENTION_S,
        prune_every_s: float = PRUNE_EVERY_S,
        prune_batch: int = PRUNE_BATCH,
    ):
        if retention_s is not None and retention_s <= 0:
            raise ValueError("the audit retention must be positive")
        self.store = store
        self._session = store._session
        self.clock = store.clock
        self.retention_s = retention_s
        self.prune_every_s, self.prune_batch = prune_every_s, prune_batch
        self._last_prune = float("-inf")
        self._prune_lock = threading.Lock()

    def append(
        self,
        *,
        method: str,
        route: str,
        status: int,
        user: str | None = None,
        role: str | None = None,
        team: str | None = None,
        job_id: str | None = None,
        target: str | None = None,
        source: str | None = None,
    ) -> int:
        """Add one entry, timed now; its id."""
        given = dict(user=user, role=role, team=team, job_id=job_id, method=method)
        given.update(route=route, target=target, source=source)
        values = {k: _bounded(mask_tokens(v), _LIMITS[k]) for k, v in given.items()}
        with self._session.begin() as s:
            row = AuditRow(ts=self.clock(), status=int(status), **values)
            s.add(row)
            s.flush()
            return row.id

    def entries(
        self,
        since: float | None = None,
        user: str | None = None,
        after: int = 0,
        limit: int = 100,
    ) -> list[AuditEntry]:
        """Entries after id `after` (at or after `since`, of `user`), oldest first."""
        q = select(AuditRow).where(AuditRow.id > after)
        horizon = self._horizon()
        if horizon is not None:
            q = q.where(AuditRow.id <= horizon)
        if since is not None:
            q = q.where(AuditRow.ts >= since)
        if user is not None:
            q = q.where(AuditRow.user == user)
        with self._session() as s:
            rows = s.scalars(q.order_by(AuditRow.id).limit(limit))
            return [AuditEntry.of(r) for r in rows]

    def _horizon(self) -> int | None:
        """As store.jobs.JobStore.event_horizon, for the audit log: None on SQLite (one
        writer at a time: ids commit in order); on PostgreSQL the greatest id once the
        transactions that insert entries have ended."""
        if self.store.engine.dialect.name == "sqlite":
            return None
        with self.store.engine.begin() as conn:
            conn.execute(text("LOCK TABLE audit_log IN SHARE MODE"))
            return conn.scalar(select(func.max(AuditRow.id))) or 0

    def prune(self, now: float | None = None) -> int:
        """Delete up to `prune_batch` entries older than the retention, oldest first;
        the number deleted."""
        if self.retention_s is None:
            return 0
        cutoff = (self.clock() if now is None else now) - self.retention_s
        oldest = (
            select(AuditRow.id)
            .where(AuditRow.ts < cutoff)
            .order_by(AuditRow.id)
            .limit(self.prune_batch)
        )
        with self._session.begin() as s:
            ids = list(s.scalars(oldest))
            if ids:
                s.execute(delete(AuditRow).where(AuditRow.id.in_(ids)))
            return len(ids)

    def prune_due(self) -> int:
        """One pruning batch when `prune_every_s` has passed since this process's last
        (at once again while batches come back full); 0 otherwise. Cheap when not due."""
        now = self.clock()
        if now - self._last_prune < self.prune_every_s or not self._prune_lock.acquire(False):
            return 0
        try:
            n = self.prune(now)
            if n < self.prune_batch:
                self._last_prune = now
            return n
        finally:
            self._prune_lock.release()

    def count(self) -> int:
        with self._session() as s:
            return s.scalar(select(func.count()).select_from(AuditRow)) or 0


def _bounded(value: str | None, limit: int) -> str | None:
    """`value` cut to `limit` characters, a NUL shown as U+FFFD (PostgreSQL's text refuses
    NUL, and a request's path or target may carry one: its entry is still written)."""
    if value is None:
        return None
    value = value.replace("\x00", "\ufffd")
    return value if len(value) <= limit else value[: limit - 1] + "…"
