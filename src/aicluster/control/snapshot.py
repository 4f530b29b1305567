"""Build the scheduler's immutable Snapshot from engine nodes and stored workloads.

A Workload is what the scheduler admits: a job's gang, or one service replica (a
gang of one). Allocation on a node is what aicluster's own admitted workloads hold
there, so decisions never depend on Ray's view of free resources lagging behind.
"""

from __future__ import annotations

from dataclasses import dataclass
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
    last_checkpoint_at: float | None = None  # its newest checkpoint, when the store knows it

    def gang(self) -> GangRequest:
        """Its GangRequest, made once (both are immutable): a view kept across ticks
        (PendingJobs.views) costs nothing to hand the scheduler again."""
        made = self.__dict__.get("_gang")
        if made is None:
            made = self.__dict__["_gang"] = self._make_gang()
        return made

    def running(self, pool: str) -> RunningWorkload:
        """Its RunningWorkload (placed, charged to `pool`), made once per pool: a view kept
        across cycles (control.active_jobs) costs nothing to hand the scheduler again."""
        made = self.__dict__.get("_running")
        if made is None or made.pool != pool:
            made = self.__dict__["_running"] = RunningWorkload(
                gang=self.gang(),
                placement=self.placement,
                started_at=self.started_at or self.created_at,
                last_checkpoint_at=self.last_checkpoint_at,
                pool=pool,
            )
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
        last_checkpoint_at=job.last_checkpoint_at,
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
        w.running(pool_of.get(w.placement[0], "default")) for w in active if w.placement
    )
    return Snapshot(
        nodes=views,
        pending=tuple(w.gang() for w in pending),
        running=running,
        quotas=tuple(quotas),
        limits=tuple(limits),
    )


class WorkloadSource(Protocol):
    """A kind of workload besides jobs that the controller schedules in the same cycle."""

    def reconcile(
        self, nodes: list[NodeInfo], alive: set[str], draining: frozenset[str]
    ) -> None: ...

    def pending_workloads(self) -> list: ...

    def active_workloads(self) -> list: ...

    def apply(self, decision) -> None: ...

    def owns(self, gang_id: str) -> bool: ...
