"""Build the scheduler's immutable Snapshot from engine nodes and stored workloads.

A Workload is what the scheduler admits: a job's gang, or one service replica (a
gang of one). Allocation on a node is what aicluster's own admitted workloads hold
there, so decisions never depend on Ray's view of free resources lagging behind.
"""

from __future__ import annotations

from dataclasses import dataclass

from aicluster.core.model import GangRequest, NodeView, Res, Snapshot
from aicluster.engine.protocol import NodeInfo
from aicluster.store.db import JobRecord

REPLICA_PREFIX = "replica:"


def per_worker(spec: dict) -> Res:
    r = spec.get("resources", {})
    return Res(float(r.get("cpus", 1.0)), int(r.get("memory", 0)), int(r.get("gpus", 0)))


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


def job_workload(job: JobRecord) -> WorkloadView:
    return WorkloadView(
        workload_id=job.id,
        team=job.team,
        workers=int(job.spec.get("workers", 1)),
        per_worker=per_worker(job.spec),
        gpu_model=job.spec.get("resources", {}).get("gpu_model"),
        priority=job.priority,
        created_at=job.created_at,
        placement=tuple(job.placement) if job.placement else None,
    )


def allocations(active: list[WorkloadView]) -> dict[str, Res]:
    used: dict[str, Res] = {}
    for w in active:
        for node_id in w.placement or ():
            used[node_id] = used.get(node_id, Res()) + w.per_worker
    return used


def build_snapshot(
    nodes: list[NodeInfo], pending: list[WorkloadView], active: list[WorkloadView],
    unschedulable: frozenset[str] = frozenset(),
) -> Snapshot:
    """`unschedulable`: nodes that take no new work (cordoned, draining, degraded)."""
    used = allocations(active)
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
        )
        for n in nodes
        if n.alive
    )
    gangs = tuple(
        GangRequest(
            workload_id=w.workload_id,
            team=w.team,
            workers=w.workers,
            per_worker=w.per_worker,
            gpu_model=w.gpu_model,
            priority=w.priority,
            submitted_at=w.created_at,
        )
        for w in pending
    )
    return Snapshot(nodes=views, pending=gangs)
