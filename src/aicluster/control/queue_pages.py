"""Pages of the scheduler's queue (`GET /v1/queue`), cheap at 100,000 pending workloads.

Vocabulary: the *snapshot* is the last cycle's queue (control.jobs_loop.Controller.queue,
a QueueSnapshot): a sequence of QueueEntry, one per workload the scheduler left waiting, in
the order it considered them, then the jobs past each team's window that the cycle did not
look at (control.pending_jobs), in queue order; replaced whole each cycle and never changed
in place. An entry's
*position* is its 1-based place among everybody's entries: other teams' entries and
service replicas count for it but are never shown (only jobs are shown, to an admin every
team's, to members and viewers their team's).

A page is built from the snapshot, in memory: its entries are scanned from where the
cursor says and those the caller may see are kept until the page is full; then only those
jobs are read from the store, in one query (Store.get_jobs), never the whole queue. A job
that left PENDING since the cycle (admitted, cancelled) is skipped and the scan goes on,
each further read twice the size of the last (at most _MAX_READ jobs), so a page is short
only at the end of the queue and a stale snapshot costs few reads.

A cursor (store.cursors, list `queue`) carries the position and the workload id of the
last entry shown. The next page continues right after that workload in the current
snapshot while it is still queued; when it is gone (admitted, cancelled) it continues at
the position it had, whose entry is then the one that followed it. Between two pages the
queue may have been reordered by a scheduling cycle: a client then sees an entry twice
(one that moved from before the cursor to after it) or misses one (moved the other way),
each page with the positions of its own moment; never an error. While the queue does not
change, following `next_cursor` from the first page to null reads every entry once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from heapq import merge
from itertools import islice
from typing import NamedTuple

from aicluster.core.lifecycle import JobStatus
from aicluster.core.model import WaitKind
from aicluster.store.cursors import BadCursor, check_limit, decode, page_of
from aicluster.store.identity import Principal
from aicluster.store.jobs import JobRecord

KIND = "queue"  # the cursors' list name
_MAX_READ = 2000  # jobs read at once when the page's first candidates had left the queue


class QueueEntry(NamedTuple):
    """One waiting workload of a cycle; `team` is None for workloads that are not jobs."""

    workload_id: str
    reason: str
    wait_kind: WaitKind
    team: str | None = None
    is_job: bool = True


class QueueSnapshot(Sequence):
    """A cycle's queue: the entries it decided (`head`, in the order it considered them),
    then the teams' queue tails it did not look at (control.pending_jobs), merged in queue
    order, each entry saying `tail_reason(team)`. The tails are copies made with the
    snapshot; their entries are made on demand, as far as a page reads (thread-safe), so
    a cycle costs nothing for the tens of thousands of entries nobody pages to."""

    def __init__(
        self,
        head: list[QueueEntry],
        tails: list[tuple[str, list[tuple]]] = (),
        tail_reason: Callable[[str], str] = str,
    ):
        self._made = list(head)
        self._len = len(head) + sum(len(keys) for _, keys in tails)
        streams = [((key, team) for key in keys) for team, keys in tails]
        self._rest = merge(*streams) if streams else iter(())
        self._reason = tail_reason
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self._len))]
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(i)
        if i >= len(self._made):
            with self._lock:
                for key, team in islice(self._rest, max(0, i + 1 - len(self._made))):
                    self._made.append(
                        QueueEntry(key[-1], self._reason(team), WaitKind.QUEUED_BEHIND, team)
                    )
        return self._made[i]


class QueuePages:
    """Pages of the snapshot that `entries` answers, with its jobs read by `get_jobs`."""

    def __init__(
        self,
        entries: Callable[[], Sequence[QueueEntry]],
        get_jobs: Callable[[Iterable[str]], list[JobRecord]],
    ):
        self._entries, self._get_jobs = entries, get_jobs
        # (snapshot, workload id -> index): made at most once per snapshot, on a cursor
        # whose workload is no longer at its position.
        self._index: tuple[Sequence[QueueEntry], dict[str, int]] | None = None

    def page(self, who: Principal, limit: int, cursor: str | None) -> tuple[list[dict], str | None]:
        """The page after `cursor` (None: the first) and the next page's cursor."""
        check_limit(limit)
        key = decode(cursor, KIND, int, str)
        entries = self._entries()
        i = 0 if key is None else self._resume(entries, *key)
        shown: list[tuple[int, QueueEntry, JobRecord]] = []
        grow = 1  # doubles each read: a snapshot most of whose jobs left costs few reads
        while len(shown) <= limit and i < len(entries):
            # (position, entry) the caller may see: what the page lacks, then more
            batch, want = [], min((limit + 1 - len(shown)) * grow, _MAX_READ)
            grow *= 2
            while i < len(entries) and len(batch) < want:
                entry = entries[i]
                i += 1
                if entry.is_job and _may_see(who, entry.team):
                    batch.append((i, entry))
            jobs = {j.id: j for j in self._get_jobs(e.workload_id for _, e in batch)}
            for position, entry in batch:
                job = jobs.get(entry.workload_id)
                pending = job is not None and job.status == JobStatus.PENDING
                if pending and _may_see(who, job.team):  # the record's team decides
                    shown.append((position, entry, job))
        page, more = page_of(shown, limit, KIND, lambda r: (r[0], r[1].workload_id))
        return [_json(position, entry, job) for position, entry, job in page], more

    def _resume(self, entries: Sequence[QueueEntry], position: int, workload: str) -> int:
        """The index the page after (`position`, `workload`) starts at (module docstring)."""
        if position < 1:
            raise BadCursor("cursor of the queue list has a malformed key")
        if position <= len(entries) and entries[position - 1].workload_id == workload:
            return position  # the queue did not move there: no index needed
        index = self._index
        if index is None or index[0] is not entries:
            index = self._index = (entries, {e.workload_id: n for n, e in enumerate(entries)})
        at = index[1].get(workload)
        return at + 1 if at is not None else min(position - 1, len(entries))


def _may_see(who: Principal, team: str | None) -> bool:
    return who.is_admin or (team is not None and team == who.team)


def _json(position: int, entry: QueueEntry, job: JobRecord) -> dict:
    return {
        "position": position,
        "workload": entry.workload_id,
        "kind": "job",
        "team": job.team,
        "name": job.name,
        "workers": job.spec.workers,
        "priority": job.priority,
        "submitted_at": job.created_at,
        "reason": entry.reason,
        "wait_kind": entry.wait_kind.value,
    }
