"""Helpers for the scheduler tests: quota'd snapshots, and applying a cycle's decisions
to get the next snapshot (as the control plane or the simulator would)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from aicluster.core.model import Admit, Preempt, Quota, RunningWorkload, Snapshot


def qsnap(nodes, pending, running=(), quotas=()) -> Snapshot:
    """A snapshot whose nodes' allocations include the running workloads."""
    used = Counter()
    held = {}
    for r in running:
        for nid in r.placement:
            held[nid] = held.get(nid)
            used[nid] += 1
    views = []
    for n in nodes:
        alloc = n.allocated
        for r in running:
            k = r.placement.count(n.node_id)
            if k:
                alloc = alloc + r.gang.per_worker.scale(k)
        views.append(replace(n, allocated=alloc))
    return Snapshot(tuple(views), tuple(pending), tuple(running), tuple(quotas))


def running(g, placement, started_at=0.0, **kw) -> RunningWorkload:
    return RunningWorkload(g, tuple(placement), started_at, **kw)


def apply(snap: Snapshot, decisions, clock: float = 0.0) -> Snapshot:
    """The next snapshot: preempted workloads back to pending, admitted ones running."""
    gangs = {g.workload_id: g for g in snap.pending}
    runs = {r.workload_id: r for r in snap.running}
    pending = dict(gangs)
    nodes = {n.node_id: n for n in snap.nodes}
    for d in decisions:
        if isinstance(d, Preempt):
            r = runs.pop(d.workload_id)
            for nid, k in Counter(r.placement).items():
                n = nodes[nid]
                nodes[nid] = replace(n, allocated=n.allocated - r.gang.per_worker.scale(k))
            pending[r.workload_id] = r.gang
    for d in decisions:
        if isinstance(d, Admit):
            g = pending.pop(d.workload_id)
            runs[g.workload_id] = RunningWorkload(
                g, d.placement, clock, pool=nodes[d.placement[0]].pool
            )
            for nid, k in Counter(d.placement).items():
                n = nodes[nid]
                nodes[nid] = replace(n, allocated=n.allocated + g.per_worker.scale(k))
    return Snapshot(
        tuple(nodes.values()), tuple(pending.values()), tuple(runs.values()), snap.quotas
    )


def q(team, gpus, **kw) -> Quota:
    return Quota(team=team, pool="default", gpus=gpus, **kw)
