"""FIFO admission: first come, first served, capacity-respecting, gang all-or-nothing.

The queue is ordered by priority (high first), then arrival. The head blocks the
queue when it does not fit now (no overtaking); a gang that could not fit even an
empty cluster is skipped so that it cannot block everyone forever.
"""

from __future__ import annotations

from aicluster.core.model import Admit, Decision, Ledger, Snapshot, Wait
from aicluster.core.placement import place_gang, why_not


def queue_order(snapshot: Snapshot):
    return sorted(snapshot.pending, key=lambda g: (-g.priority, g.submitted_at, g.workload_id))


def plan_cycle(snapshot: Snapshot) -> list[Decision]:
    ledger = Ledger.of(snapshot.nodes)
    empty = {n.node_id: n.capacity for n in snapshot.nodes if n.schedulable}
    decisions: list[Decision] = []
    blocked_by: str | None = None
    for gang in queue_order(snapshot):
        if place_gang(gang, snapshot.nodes, empty) is None:
            decisions.append(Wait(gang.workload_id, why_not(gang, snapshot.nodes, empty), True))
            continue
        if blocked_by is not None:
            decisions.append(Wait(gang.workload_id, f"queued behind {blocked_by}"))
            continue
        placement = place_gang(gang, snapshot.nodes, ledger.free)
        if placement is None:
            decisions.append(Wait(gang.workload_id, why_not(gang, snapshot.nodes, ledger.free)))
            blocked_by = gang.workload_id
            continue
        for node_id in placement:
            ledger.take(node_id, gang.per_worker)
        decisions.append(Admit(gang.workload_id, placement))
    return decisions
