"""Test builders for the scheduler model: nodes, gangs, snapshots, and helpers
that read decisions back. Plain functions with small defaults, so each test
states only what matters to it."""

from __future__ import annotations

from collections import defaultdict

from aicluster.core.model import Admit, GangRequest, NodeView, Res, Snapshot, Wait

GiB = 2**30


def res(cpus: float = 0.0, memory: int = 0, gpus: int = 0) -> Res:
    return Res(cpus=float(cpus), memory=int(memory), gpus=int(gpus))


def node(
    node_id: str,
    *,
    gpus: int = 0,
    cpus: float = 64,
    memory: int = 512 * GiB,
    used_gpus: int = 0,
    used_cpus: float = 0,
    used_memory: int = 0,
    gpu_model: str | None = None,
    schedulable: bool = True,
    name: str | None = None,
    pool: str = "default",
) -> NodeView:
    """A node; `used_*` is what is already allocated on it."""
    return NodeView(
        node_id=node_id,
        name=name if name is not None else node_id,
        capacity=res(cpus, memory, gpus),
        allocated=res(used_cpus, used_memory, used_gpus),
        pool=pool,
        gpu_model=gpu_model,
        schedulable=schedulable,
    )


def gang(
    workload_id: str,
    *,
    workers: int = 1,
    gpus: int = 0,
    cpus: float = 1,
    memory: int = 0,
    gpu_model: str | None = None,
    priority: int = 0,
    submitted_at: float = 0.0,
    team: str = "t",
) -> GangRequest:
    """A pending gang of `workers` identical workers, each needing the given resources."""
    return GangRequest(
        workload_id=workload_id,
        team=team,
        workers=workers,
        per_worker=res(cpus, memory, gpus),
        gpu_model=gpu_model,
        priority=priority,
        submitted_at=submitted_at,
    )


def snapshot(nodes, gangs) -> Snapshot:
    return Snapshot(nodes=tuple(nodes), pending=tuple(gangs))


def by_id(decisions) -> dict:
    """workload id -> its decision (asserting each id is decided once)."""
    out = {}
    for d in decisions:
        assert d.workload_id not in out, f"{d.workload_id} decided twice"
        out[d.workload_id] = d
    return out


def admits(decisions) -> dict[str, tuple[str, ...]]:
    return {d.workload_id: d.placement for d in decisions if isinstance(d, Admit)}


def waits(decisions) -> dict[str, Wait]:
    return {d.workload_id: d for d in decisions if isinstance(d, Wait)}


def usage_per_node(snap: Snapshot, decisions) -> dict[str, Res]:
    """Resources that the admitted gangs take on each node."""
    gangs = {g.workload_id: g for g in snap.pending}
    used: dict[str, Res] = defaultdict(Res)
    for d in decisions:
        if isinstance(d, Admit):
            for node_id in d.placement:
                used[node_id] = used[node_id] + gangs[d.workload_id].per_worker
    return dict(used)
