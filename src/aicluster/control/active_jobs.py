"""The ADMITTED and RUNNING jobs the reconcile loop watches, kept across ticks.

Each `refresh` reads only what changed since the last one, from the event log (every
write to a job writes its event in the same transaction): the jobs kept that have an
event since, and the jobs with a transition since (the only way into ADMITTED or
RUNNING). So a tick costs what changed, not every running job.

A store that lost commits the cache had read (a database crash with asynchronous commits)
is noticed by the newest event read having gone: the cache is then read whole again, and
`rewound` says so (the loop then forgets what it keeps beside it: control.jobs_loop).

Invariants: after `refresh`, `jobs()` answers exactly the jobs that were ADMITTED or
RUNNING at a moment no older than its start, each as read then, newest first like
`Store.list_jobs(limit=None)`. A full read happens on the first refresh and after `reset`
(a new term of leadership); every `resync_s` seconds a check, as a safety net, compares
the kept jobs with the id and updated_at of every active job in the store (every write to
a job sets its updated_at) and reads the jobs that differ (as control.pending_jobs).
`views()` answers `job_workload` of each, the view made last time for a record that is
the same one (a view is immutable and depends on its record alone).
"""

from __future__ import annotations

import time
from operator import attrgetter

from aicluster.control.snapshot import WorkloadView, job_workload
from aicluster.core.lifecycle import JobStatus
from aicluster.store.jobs import JobRecord

ACTIVE = (JobStatus.ADMITTED, JobStatus.RUNNING)
_SEQ = attrgetter("seq")


class JobCache:
    """What the pending and the active jobs' caches share: the mark into the event log,
    the newest event read, the safety net's clock, and reading what changed."""

    def __init__(self, store, resync_s: float = 60.0, clock=time.monotonic):
        self.store, self.resync_s, self.clock = store, resync_s, clock
        self._jobs: dict[str, JobRecord] = {}
        self._views: dict[str, tuple[JobRecord, WorkloadView]] = {}
        self._mark: int | None = None  # event id the cache is current to
        self._full_at = float("-inf")
        self._anchor: tuple[int, str] | None = None  # the newest event read: (id, job id)
        self.rewound = False  # the last refresh found the store had lost events it read

    def reset(self) -> None:
        self._mark, self._anchor = None, None

    def jobs(self) -> list[JobRecord]:
        """The kept jobs, newest first (as Store.list_jobs)."""
        return sorted(self._jobs.values(), key=_SEQ, reverse=True)

    def _check_rewound(self) -> None:
        """Whether the store lost the newest event read (a database that crashed with
        asynchronous commits loses its last commits and hands their ids out again, so
        events past the mark would never be seen): then reset, to be read whole."""
        anchor = self._anchor
        self.rewound = (
            self._mark is not None and anchor is not None and not self.store.has_event(*anchor)
        )
        if self.rewound:
            self.reset()

    def _read_changed(self, events: list, mark: int, changed: set[str], statuses) -> list:
        """The jobs that `changed` names, read (with, every `resync_s`, those the safety
        net finds differing, added to `changed`); only once every read has answered do the
        mark, newest event and resync time move, so a store that fails halfway (it
        restarts) leaves the cache as it was, to be read again. The caller then drops
        `changed` and keeps what was read that is still in its statuses."""
        resync = self.clock() - self._full_at >= self.resync_s
        if resync:
            changed |= differing(self._jobs, self.store.job_versions(*statuses))
        fresh = self.store.get_jobs(changed)
        self._mark = mark
        if events:
            self._anchor = tuple(events[-1][:2])
        if resync:
            self._full_at = self.clock()
        return fresh


class ActiveJobs(JobCache):
    def refresh(self) -> list[JobRecord]:
        """`update`, then `jobs()`."""
        self.update()
        return self.jobs()

    def update(self) -> None:
        """Bring the kept jobs up to date."""
        self._check_rewound()
        if self._mark is None:
            mark = self.store.event_mark()  # before the read: later changes are re-read
            self._jobs = {j.id: j for j in self.store.list_jobs(statuses=ACTIVE, limit=None)}
            self._mark, self._full_at = mark, self.clock()
            return
        events, mark = self.store.job_events_since(self._mark, with_type=True)
        kept = self._jobs
        changed = {job for _, job, kind in events if job in kept or kind == "JobTransition"}
        fresh = self._read_changed(events, mark, changed, ACTIVE)
        for job_id in changed:
            kept.pop(job_id, None)
        for j in fresh:
            if j.status in ACTIVE:
                kept[j.id] = j
        if len(self._views) > 2 * len(kept):
            self._views = {i: v for i, v in self._views.items() if i in kept}

    def views(self) -> list[WorkloadView]:
        """`job_workload` of every kept job, reused while its record is the same."""
        views, out = self._views, []
        for j in self._jobs.values():
            hit = views.get(j.id)
            if hit is None or hit[0] is not j:
                hit = views[j.id] = (j, job_workload(j))
            out.append(hit[1])
        return out


def differing(kept: dict[str, JobRecord], stored: dict[str, float]) -> set[str]:
    """The ids that a cache's `kept` jobs and the store's `stored` versions (id ->
    updated_at, Store.job_versions) disagree on: missing on either side, or another
    updated_at (every write to a job sets it)."""
    out = {i for i, at in stored.items() if (j := kept.get(i)) is None or j.updated_at != at}
    out.update(i for i in kept if i not in stored)
    return out
