"""The reconcile loop's writes of many jobs at once (mixed into store.db.Store): batched
compare-and-set transitions and wait messages, a few hundred per transaction.

Invariants: each job's change commits with its Event (a transaction all or nothing, so
jobs_changed_since and the event log never miss a change); a transition is the same
compare-and-set as `JobStore.transition` (which is a batch of one); every commit goes
through the engine's commit, so the leader's fence (store.lease) checks each batch.
"""

from __future__ import annotations

from functools import lru_cache

from sqlalchemy import bindparam, insert, select, update

from aicluster.core.lifecycle import JobStatus, Reason, check_transition
from aicluster.core.model import WaitKind
from aicluster.store.jobs import JobRecord, Move, job_query, move_values
from aicluster.store.schema import EventRow, JobRow


@lru_cache(maxsize=64)
def _update(columns: tuple[str, ...]):
    """The compare-and-set UPDATE of a transition that sets `columns` (bound parameters:
    one compiled statement per set of columns, reused)."""
    t = JobRow.__table__
    return (
        update(t)
        .where(t.c.id == bindparam("_id"), t.c.status == bindparam("_src"))
        .values({c: bindparam(c, type_=t.c[c].type) for c in columns})
    )


class _NotAllMoved(Exception):
    """A batch's grouped UPDATEs moved fewer jobs than it holds (rolls its transaction back)."""


class JobWrites:
    """Batched job writes; needs store.jobs.JobStore's `_event` (both mixed into Store)."""

    def transitions(self, moves: list[Move], per_commit: int = 500) -> list[JobRecord | None]:
        """`transition` for many jobs, up to `per_commit` in one transaction (one commit,
        not one per job): each job's status and its Event commit together, a batch all or
        nothing. The records in the order of `moves`, None where a job was no longer in
        its `src`. Every move is checked before anything is written."""
        for m in moves:
            check_transition(m.src, m.dst)
            if (m.reason == Reason.REQUEUED) != (m.requeue_cause is not None):
                raise ValueError("a requeue, and only a requeue, names its requeue_cause")
        out: list[JobRecord | None] = []
        for i in range(0, len(moves), per_commit):
            batch = moves[i : i + per_commit]
            try:
                out += self._transitions(batch, together=True)
            except _NotAllMoved:  # rolled back: one by one, to learn which ones move
                out += self._transitions(batch, together=False)
        return out

    def _transitions(self, batch: list[Move], together: bool) -> list[JobRecord | None]:
        """One transaction. `together`: the UPDATEs that set the same columns go as one
        executemany, and _NotAllMoved (the transaction rolled back) unless every job was
        in its `src`, which is the common case: a loop's batch races only the odd cancel.
        Else, and when a job moves twice in the batch, one UPDATE per move, in order."""
        now = self.clock()
        with self._session.begin() as s:
            conn = s.connection()  # Core statements: no ORM objects to synchronise
            prepared = []  # (the columns it sets, its parameters) per move
            for m in batch:
                values = move_values(m, now)
                params = {"_id": m.job_id, "_src": m.src.value, **values}
                prepared.append((tuple(sorted(values)), params))
            if (
                together
                and conn.dialect.supports_sane_multi_rowcount
                and len({m.job_id for m in batch}) == len(batch)
            ):
                groups: dict[tuple, list[dict]] = {}
                for columns, params in prepared:
                    groups.setdefault(columns, []).append(params)
                for columns, group in groups.items():
                    if conn.execute(_update(columns), group).rowcount != len(group):
                        raise _NotAllMoved()
                moved = [True] * len(batch)
            else:
                moved = [conn.execute(_update(c), p).rowcount == 1 for c, p in prepared]
            ids = [m.job_id for m, ok in zip(batch, moved) if ok]
            rows = {r.id: r for r in s.execute(job_query(JobRow.id.in_(ids)))} if ids else {}
            events = [self._moved(m, rows[m.job_id]) for m, ok in zip(batch, moved) if ok]
            if events:  # one executemany, in order: ids ascend as the moves do
                conn.execute(insert(EventRow.__table__), events)
            return [JobRecord.of(rows[m.job_id]) if ok else None for m, ok in zip(batch, moved)]

    def _moved(self, m: Move, row) -> dict:
        """The Event of a transition just made (its columns, for the batch's insert)."""
        return self._event_values(
            "job",
            m.job_id,
            row.team,
            "JobTransition",
            m.src.value,
            m.dst.value,
            m.reason,
            m.message,
            m.actor,
            attempt=row.attempt or None,
            placement=list(row.placement or []) if m.dst == JobStatus.ADMITTED else None,
            requeue_cause=m.requeue_cause.value if m.requeue_cause is not None else None,
            interrupted_at=m.interrupted_at,
        )

    def set_wait_messages(
        self, waits: list[tuple[str, str, WaitKind]], written: dict | None = None
    ) -> int:
        """`set_wait_message` for many (job id, message, kind) at once, a few hundred per
        transaction (one commit each, not one per job); how many changed. `written`, when
        given, gets event id -> (job id, message, kind, updated_at) for each wait written,
        once its transaction has committed (control.pending_jobs.PendingJobs: what it wrote
        itself needs no read)."""
        changed = 0
        for i in range(0, len(waits), 500):
            batch = waits[i : i + 500]
            done = []
            with self._session.begin() as s:
                q = select(JobRow).where(JobRow.id.in_([w[0] for w in batch]))
                rows = {r.id: r for r in s.scalars(q)}
                for job_id, message, kind in batch:
                    row = rows.get(job_id)
                    if row is None or row.status != JobStatus.PENDING.value:
                        continue
                    if row.message == message and row.wait_kind == kind.value:
                        continue
                    now = self.clock()
                    row.message, row.wait_kind, row.updated_at = message, kind.value, now
                    event = self._event(
                        s, "job", job_id, row.team, "JobWaiting", reason=kind.value, message=message
                    )
                    done.append((event, (job_id, message, kind, now)))
                s.flush()  # the events' ids
                ids = [(event.id, what) for event, what in done]
            if written is not None:
                written.update(ids)
            changed += len(done)
        return changed

    def has_event(self, event_id: int, object_id: str) -> bool:
        """Whether the event `event_id` of `object_id` is in the log: a cache that read it
        asks, to learn whether the store lost its newest commits (a database that crashed
        with asynchronous commits hands the same ids out again)."""
        q = select(EventRow.id).where(EventRow.id == event_id, EventRow.object_id == object_id)
        with self._session() as s:
            return s.scalar(q) is not None

    def job_events_since(self, after: int, with_type: bool = False) -> tuple[list[tuple], int]:
        """(event id, job id) of every job event after event id `after`, in order, and
        the event id to pass next time (never past the event horizon: none is missed).
        `with_type`: (event id, job id, event type) instead."""
        top = max(after, self.event_mark())
        columns = [EventRow.id, EventRow.object_id] + ([EventRow.type] if with_type else [])
        q = (
            select(*columns)
            .where(EventRow.id > after, EventRow.id <= top, EventRow.kind == "job")
            .order_by(EventRow.id)
        )
        with self._session() as s:
            return [tuple(r) for r in s.execute(q)], top
