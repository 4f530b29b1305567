"""Build the scheduler's immutable Snapshot from engine nodes and stored workloads.

A Workload is what the scheduler admits: a job's gang, or one service replica (a
gang of one). Allocation on a node is what aicluster's own admitted workloads hold
there, so decisions never depend on Ray's view of free resources lagging behind.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from operator import attrgetter
from typing import Protocol

from aicluster.core.lifecycle import JobStatus
from aicluster.core.model import (
    GangRequest,
    NodeView,
    Quota,
    Res,
    RunningWorkload,
    Snapshot,
    TeamLimit,
)
from aicluster.engine.protocol import NodeInfo
from aicluster.specs.job import JobSpec
from aicluster.specs.service import ServiceSpec
from aicluster.store.jobs import JobRecord


def per_worker(spec: ServiceSpec) -> Res:
    """What one replica of a service needs."""
    r = spec.resources
    return Res(r.cpus, r.memory, r.gpus)


@dataclass(frozen=True)
class WorkloadView:
    workload_id: str
    team: str
    workers: int
    per_worker: Res
    gpu_model: str | None
    priority: int
    created_at: float
    placement: tuple[str, ...] | None = None
    started_at: float | None = None
    preemptible: bool = True
    preferred_nodes: tuple[str, ...] = ()  # nodes that cache its artifacts (a soft hint)
    nodes: frozenset[str] | None = None  # the only nodes it may use (spec `nodes`), a hard rule

    def gang(self) -> GangRequest:
        """Its GangRequest, made once (both are immutable): a view kept across ticks
        (PendingJobs.views) costs nothing to hand the scheduler again."""
        made = self.__dict__.get("_gang")
        if made is None:
            made = self.__dict__["_gang"] = self._make_gang()
        return made

    def _make_gang(self) -> GangRequest:
        return GangRequest(
            workload_id=self.workload_id,
            team=self.team,
            workers=self.workers,
            per_worker=self.per_worker,
            gpu_model=self.gpu_model,
            priority=self.priority,
            submitted_at=self.created_at,
            preemptible=self.preemptible,
            preferred_nodes=self.preferred_nodes,
            nodes=self.nodes,
        )


def artifact_keys(spec: ServiceSpec) -> list[str]:
    """The artifacts a service replica materialises on its node: its model, if an artifact."""
    if spec.model.startswith("artifact:"):
        return [spec.model[len("artifact:") :]]
    return []


def job_artifact_keys(spec: JobSpec) -> list[str]:
    """The artifacts a job materialises on its nodes: its inputs."""
    return [i.artifact for i in spec.inputs]


def preferred(spec: ServiceSpec, where: dict[str, set[str]]) -> tuple[str, ...]:
    """Nodes that received this service's artifacts before, most shared artifacts first."""
    return nodes_holding(artifact_keys(spec), where)


def nodes_holding(keys: list[str], where: dict[str, set[str]]) -> tuple[str, ...]:
    """Nodes that received these artifacts before, most shared artifacts first."""
    counts: dict[str, int] = {}
    for key in keys:
        for node_id in where.get(key, ()):
            counts[node_id] = counts.get(node_id, 0) + 1
    return tuple(sorted(counts, key=lambda n: (-counts[n], n)))


def job_workload(job: JobRecord, where: dict[str, set[str]] | None = None) -> WorkloadView:
    r = job.spec.resources
    return WorkloadView(
        workload_id=job.id,
        team=job.team,
        workers=job.spec.workers,
        per_worker=Res(r.cpus, r.memory, r.gpus),
        gpu_model=r.gpu_model,
        priority=job.priority,
        created_at=job.created_at,
        placement=tuple(job.placement) if job.placement else None,
        # a pending job's view is its gang: nothing in it changes with its wait message
        started_at=job.started_at or (None if job.status == JobStatus.PENDING else job.updated_at),
        preferred_nodes=nodes_holding(job_artifact_keys(job.spec), where) if where else (),
        nodes=frozenset(job.spec.nodes) if job.spec.nodes is not None else None,
    )


def allocations(active: list[WorkloadView]) -> dict[str, Res]:
    used: dict[str, Res] = {}
    for w in active:
        for node_id in w.placement or ():
            used[node_id] = used.get(node_id, Res()) + w.per_worker
    return used


def build_snapshot(
    nodes: list[NodeInfo],
    pending: list[WorkloadView],
    active: list[WorkloadView],
    unschedulable: frozenset[str] = frozenset(),
    quotas: tuple[Quota, ...] = (),
    limits: tuple[TeamLimit, ...] = (),
    used: dict[str, Res] | None = None,
) -> Snapshot:
    """`unschedulable`: nodes that take no new work (cordoned, draining, degraded).
    Racks come from the node label `rack`; a running workload is charged to the pool
    of the node its rank 0 runs on. `limits`: the teams' caps and holds (control.budgets).
    `used`: `allocations(active)` when the caller has it already."""
    used = allocations(active) if used is None else used
    pool_of = {n.node_id: n.pool for n in nodes}
    views = tuple(
        NodeView(
            node_id=n.node_id,
            name=n.name,
            capacity=Res(n.cpus, n.memory, n.gpus),
            allocated=used.get(n.node_id, Res()),
            pool=n.pool,
            gpu_model=n.gpu_model,
            labels=tuple(sorted(n.labels.items())),
            schedulable=n.node_id not in unschedulable,
            rack=n.labels.get("rack"),
        )
        for n in nodes
        if n.alive
    )
    running = tuple(
        RunningWorkload(
            gang=w.gang(),
            placement=w.placement,
            started_at=w.started_at or w.created_at,
            pool=pool_of.get(w.placement[0], "default"),
        )
        for w in active
        if w.placement
    )
    return Snapshot(
        nodes=views,
        pending=tuple(w.gang() for w in pending),
        running=running,
        quotas=tuple(quotas),
        limits=tuple(limits),
    )


_SEQ = attrgetter("seq")


class PendingJobs:
    """The PENDING jobs, kept across ticks and brought up to date from the event log:
    each refresh reads only the jobs that changed since the last one (every write to a job
    writes its event in the same transaction: store.jobs.jobs_changed_since), so a tick
    costs what changed, not everything queued.

    Invariant: `refresh` answers exactly the jobs that were PENDING at a moment no older
    than its start, each as read then, newest first like `Store.list_jobs(limit=None)`.
    The waits the loop wrote itself (`written`, filled by Store.set_wait_messages once
    committed) are not read back: a job whose only events since are those gets the
    message, kind and updated_at it was written with, which is what a read would give
    (any other write to it has an event of its own, and then it is read). A full read
    happens on the first refresh and after `reset` (a new term of leadership). Every
    `resync_s` seconds a check, as a safety net, compares the kept jobs with the id and
    updated_at of every PENDING job in the store (every write to a job sets its
    updated_at) and reads the jobs that differ: at 100,000 pending that costs ~1/20 of a
    full read, which had made every 60th second's tick the slowest by far."""

    def __init__(self, store, resync_s: float = 60.0, clock=time.monotonic):
        self.store, self.resync_s, self.clock = store, resync_s, clock
        self._jobs: dict[str, JobRecord] = {}
        self._views: dict[str, tuple[JobRecord, WorkloadView]] = {}
        self._mark: int | None = None  # event id the cache is current to
        self._full_at = float("-inf")
        # event id -> (job id, message, kind, updated_at): the waits this loop wrote
        self.written: dict[int, tuple] = {}

    def reset(self) -> None:
        self._mark = None

    def refresh(self) -> list[JobRecord]:
        pending = JobStatus.PENDING
        if self._mark is None:
            mark = self.store.event_mark()  # before the read: later changes are re-read
            jobs = self.store.list_jobs(statuses=[pending], limit=None)
            self._jobs = {j.id: j for j in jobs}
            self._mark, self._full_at = mark, self.clock()
            self.written.clear()  # written before the mark: in what was just read
        else:
            events, self._mark = self.store.job_events_since(self._mark)
            changed = self._own_waits(events)
            if self.clock() - self._full_at >= self.resync_s:
                changed |= self._differing()
                self._full_at = self.clock()
            for gone in changed:
                self._jobs.pop(gone, None)
            for j in self.store.get_jobs(changed):
                if j.status == pending:
                    self._jobs[j.id] = j
        return sorted(self._jobs.values(), key=_SEQ, reverse=True)

    def by_id(self) -> dict[str, JobRecord]:
        """What the last `refresh` answered, by job id (do not change it)."""
        return self._jobs

    def _differing(self) -> set[str]:
        """The ids of the jobs that the kept ones and the store's PENDING ones disagree
        on: missing on either side, or with another updated_at. Read after the events
        were: a change made meanwhile is read again by the next refresh (its event is
        past the mark), so the cache is never left behind by this check."""
        stored = self.store.job_versions(JobStatus.PENDING)
        kept = self._jobs
        out = {i for i, at in stored.items() if (j := kept.get(i)) is None or j.updated_at != at}
        out.update(i for i in kept if i not in stored)
        return out

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
            self._jobs[job_id] = new
            view = self._views.get(job_id)
            if view is not None and view[0] is job:  # the same view (job_workload)
                self._views[job_id] = (new, view[1])
        return other

    def views(self, jobs: list[JobRecord], where: dict[str, set[str]]) -> list[WorkloadView]:
        """`job_workload` of each of `jobs` (from `refresh`): the view made last time when
        the record is the same one and the job has no inputs (else its preferred nodes,
        from `where`, may have changed since). The kept views are updated in place (a
        tick allocates for what changed only); those of jobs gone are dropped when they
        outnumber the jobs."""
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
        if len(kept) > len(jobs):
            ids = {j.id for j in jobs}
            for gone in [i for i in kept if i not in ids]:
                del kept[gone]
        return out


class WorkloadSource(Protocol):
    """A kind of workload besides jobs that the controller schedules in the same cycle."""

    def reconcile(
        self, nodes: list[NodeInfo], alive: set[str], draining: frozenset[str]
    ) -> None: ...

    def pending_workloads(self) -> list: ...

    def active_workloads(self) -> list: ...

    def apply(self, decision) -> None: ...

    def owns(self, gang_id: str) -> bool: ...
