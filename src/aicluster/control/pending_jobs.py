"""The PENDING jobs the reconcile loop schedules, kept across ticks, and each team's queue.

Vocabulary:
- a team's *queue*: its PENDING jobs in queue order, highest priority first, then oldest
  (created_at), then id: `queue_key`;
- the *window* (`window(depth)`): the first `depth` jobs of every team's queue, what one
  scheduling cycle sees (control.admission); a queue longer than that is *truncated* and its
  jobs past the window are the *tail*. The simulator shows its policies the same window
  (sim.replay `queue_depth`), so the figures of `bench/scheduler.py` are the live plane's.

Invariants:
- after `refresh`, the kept jobs are exactly the jobs PENDING at a moment no older than its
  start, each as read then (see `PendingJobs`), and the team queues hold exactly their ids,
  in queue order;
- `unsettled` holds every kept job that was read (new or changed) since it was last cleared,
  and every job that a newcomer pushed from inside a window to its tail: what may need a new
  wait message although the cycle did not decide it.
"""

from __future__ import annotations

import time
from bisect import bisect_left, insort

from aicluster.control.active_jobs import JobCache
from aicluster.control.snapshot import WorkloadView, job_workload
from aicluster.core.lifecycle import JobStatus
from aicluster.store.jobs import JobRecord


def queue_key(job: JobRecord) -> tuple[int, float, str]:
    """A job's place in its team's queue (the simulator's order: sim.replay)."""
    return (-job.priority, job.created_at, job.id)


class PendingJobs(JobCache):
    """The PENDING jobs, kept across ticks and brought up to date from the event log:
    each refresh reads only the jobs that changed since the last one (every write to a job
    writes its event in the same transaction: store.jobs.jobs_changed_since), so a tick
    costs what changed, not everything queued.

    Invariant: after `refresh`, `jobs()` answers exactly the jobs that were PENDING at a
    moment no older than its start, each as read then, newest first like
    `Store.list_jobs(limit=None)`. The waits the loop wrote itself (`written`, filled by
    Store.set_wait_messages once committed) are not read back: a job whose only events
    since are those gets the message, kind and updated_at it was written with, which is
    what a read would give (any other write to it has an event of its own, and then it is
    read). A full read happens on the first refresh and after `reset` (a new term of
    leadership). Every `resync_s` seconds a check, as a safety net, compares the kept jobs
    with the id and updated_at of every PENDING job in the store (every write to a job sets
    its updated_at) and reads the jobs that differ: at 100,000 pending that costs ~1/20 of
    a full read, which had made every 60th second's tick the slowest by far."""

    def __init__(self, store, resync_s: float = 60.0, clock=time.monotonic, depth: int = 32):
        super().__init__(store, resync_s, clock)
        self.depth = depth  # the window a team's queue is cut to (module docstring)
        self._queues: dict[str, list[tuple]] = {}  # team -> queue keys, in order
        # event id -> (job id, message, kind, updated_at): the waits this loop wrote
        self.written: dict[int, tuple] = {}
        self.unsettled: set[str] = set()

    def refresh(self) -> None:
        """Bring the kept jobs and the queues up to date (see the class docstring)."""
        pending = JobStatus.PENDING
        self._check_rewound()
        if self._mark is None:
            mark = self.store.event_mark()  # before the read: later changes are re-read
            jobs = self.store.list_jobs(statuses=[pending], limit=None)
            self._jobs = {j.id: j for j in jobs}
            self._queues = {}
            for j in jobs:
                self._queues.setdefault(j.team, []).append(queue_key(j))
            for q in self._queues.values():
                q.sort()
            self.unsettled = set(self._jobs)
            self._mark, self._full_at = mark, self.clock()
            self.written.clear()  # written before the mark: in what was just read
            return
        # (The loop's own waits are applied first: committed, whatever happens next.)
        events, mark = self.store.job_events_since(self._mark)
        changed = self._own_waits(events)
        fresh = self._read_changed(events, mark, changed, (pending,))
        for gone in changed:
            self.drop(gone)
        for j in fresh:
            if j.status == pending:
                self._add(j)

    def by_id(self) -> dict[str, JobRecord]:
        """The kept jobs by id (do not change it)."""
        return self._jobs

    def window(self) -> tuple[list[JobRecord], bool]:
        """The first `depth` jobs of each team's queue, and whether any queue is longer."""
        d, jobs = self.depth, self._jobs
        out: list[JobRecord] = []
        truncated = False
        for q in self._queues.values():
            out.extend(jobs[k[2]] for k in q[:d])
            truncated = truncated or len(q) > d
        return out, truncated

    def tails(self) -> list[tuple[str, list[tuple]]]:
        """(team, its queue's tail as queue keys, a copy) for each truncated queue; a
        key's last item is the job's id."""
        d = self.depth
        return [(t, q[d:]) for t, q in self._queues.items() if len(q) > d]

    def in_tail(self, job: JobRecord) -> bool:
        q = self._queues.get(job.team)
        return (
            q is not None and len(q) > self.depth and bisect_left(q, queue_key(job)) >= self.depth
        )

    def drop(self, job_id: str) -> None:
        """Forget a job (it left PENDING, or is about to be read again)."""
        job = self._jobs.pop(job_id, None)
        if job is None:
            return
        q = self._queues[job.team]
        key = queue_key(job)
        at = bisect_left(q, key)
        if at < len(q) and q[at] == key:
            del q[at]
        if not q:
            del self._queues[job.team]
        self.unsettled.discard(job_id)

    def _add(self, job: JobRecord) -> None:
        self._jobs[job.id] = job
        q = self._queues.setdefault(job.team, [])
        key = queue_key(job)
        insort(q, key)
        self.unsettled.add(job.id)
        d = self.depth
        if len(q) > d and q[d] > key:  # it came in ahead: the window's last is now tail
            self.unsettled.add(q[d][2])

    def _own_waits(self, events: list[tuple[int, str]]) -> set[str]:
        """Apply the waits this loop wrote to the jobs whose only events they are; the
        ids of the jobs changed otherwise (to read)."""
        written = self.written
        other = {job_id for event_id, job_id in events if event_id not in written}
        for event_id, job_id in events:
            wait = written.pop(event_id, None)
            job = self._jobs.get(job_id) if wait is not None and job_id not in other else None
            if job is None:
                continue
            _, message, kind, updated_at = wait
            new = job.with_wait(message, kind, updated_at)
            self._jobs[job_id] = new  # its queue key is the same
            view = self._views.get(job_id)
            if view is not None and view[0] is job:  # the same view (job_workload)
                self._views[job_id] = (new, view[1])
        return other

    def views(self, jobs: list[JobRecord], where: dict[str, set[str]]) -> list[WorkloadView]:
        """`job_workload` of each of `jobs` (kept ones): the view made last time when the
        record is the same one and the job has no inputs (else its preferred nodes, from
        `where`, may have changed since). The kept views are updated in place (a tick
        allocates for what changed only); those of jobs no longer kept are dropped when
        they outnumber the kept jobs."""
        kept, out = self._views, []
        for j in jobs:
            hit = kept.get(j.id)
            if hit is not None and hit[0] is j:
                out.append(hit[1])
                continue
            view = job_workload(j, where)
            if not j.spec.inputs:
                kept[j.id] = (j, view)
            elif hit is not None:
                del kept[j.id]
            out.append(view)
        if len(kept) > len(self._jobs):
            for gone in [i for i in kept if i not in self._jobs]:
                del kept[gone]
        return out
