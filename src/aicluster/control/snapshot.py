"""Build the scheduler's immutable Snapshot from engine nodes and stored jobs.

Allocation on a node is what aicluster's own ADMITTED and RUNNING gangs hold there,
so decisions never depend on Ray's view of free resources lagging behind.
"""

from __future__ import annotations

from aicluster.core.model import GangRequest, NodeView, Res, Snapshot
from aicluster.engine.protocol import NodeInfo
from aicluster.store.db import JobRecord


def per_worker(spec: dict) -> Res:
    r = spec.get("resources", {})
    return Res(float(r.get("cpus", 1.0)), int(r.get("memory", 0)), int(r.get("gpus", 0)))


def build_snapshot(
    nodes: list[NodeInfo], pending: list[JobRecord], active: list[JobRecord]
) -> Snapshot:
    allocated: dict[str, Res] = {}
    for job in active:
        for node_id in job.placement or []:
            allocated[node_id] = allocated.get(node_id, Res()) + per_worker(job.spec)
    views = tuple(
        NodeView(
            node_id=n.node_id,
            name=n.name,
            capacity=Res(n.cpus, n.memory, n.gpus),
            allocated=allocated.get(n.node_id, Res()),
            pool=n.pool,
            gpu_model=n.gpu_model,
            labels=tuple(sorted(n.labels.items())),
        )
        for n in nodes
        if n.alive
    )
    gangs = tuple(
        GangRequest(
            workload_id=j.id,
            team=j.team,
            workers=int(j.spec.get("workers", 1)),
            per_worker=per_worker(j.spec),
            gpu_model=j.spec.get("resources", {}).get("gpu_model"),
            priority=j.priority,
            submitted_at=j.created_at,
        )
        for j in pending
    )
    return Snapshot(nodes=views, pending=gangs)
