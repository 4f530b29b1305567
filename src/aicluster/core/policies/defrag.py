"""Defragmentation: moving cheap, checkpointable work so that a gang gets its shape.

Vocabulary: a *mover* is a running workload stopped only to start again at once on
other nodes of the same pool (`Preempt(move=True)`); what a move costs is the work the
mover loses (run since its last checkpoint) plus its restore. A gang is *fragmented
out* when its pool has the free GPUs it needs but not in the shape it needs (whole
nodes, one rack): its team's guarantee would then be a GPU count it can never hold.

When: `fair`'s guaranteed pass asks, for a gang within its team's guarantee that finds
no room and for which reclaiming borrowed work was not enough, while its pool has at
least as many free GPUs as the gang needs (the room exists, only scattered).

How (`Defragmenter.defrag`):
1. Candidates: preemptible running workloads of the pool, not already going, smaller
   than the gang (GPUs), of no higher priority, whose last checkpoint is at most
   `max_lost_s` old, or as old as the gang has waited if that is longer, up to three
   times `max_lost_s` (with checkpoints every 30 min, everything that checkpoints is
   movable once the gang has waited 30 min: the wait for a shape is bounded; work that
   never checkpoints is movable only while young): any team's, guaranteed work
   included (a move keeps its room).
2. Nodes are cleared cheapest first (the candidates' lost work plus a restore each,
   per node), freeing their candidates until the gang can be placed; candidates the
   placement turns out not to need are kept where they are (checked last freed first).
3. The movers' room stays theirs until they have stopped (and the gang's free room is
   taken for it, as a preemption's is: `preemption.keep_free_room`), then every mover
   is placed anew, largest first, on nodes other than the gang's. If one does not fit,
   everything is undone.
(Also stopping other teams' borrowed work in the same pass, and defragmenting for a
fair-share reclaim, were measured on Philly and left out: no better on the whole, more
preemptions.)

Invariants: nothing moves unless the gang and every mover fit together in this cycle's
free capacity; a move changes no team's usage (same pool, same size), so no team loses
its guarantee by being moved; each mover's new room is returned (`Moves.rooms`) for the
policy to keep for it until it starts again.
"""

from __future__ import annotations

from typing import NamedTuple

from aicluster.core.model import GangRequest, RunningWorkload
from aicluster.core.policies.base import Cycle
from aicluster.core.policies.preemption import keep_free_room

RESTORE_S = 60.0  # what a restore is counted as in a move's cost (seconds per GPU)


class Moves(NamedTuple):
    """A defragmentation found for a gang: where the gang goes, and each mover with the
    placement it starts again on."""

    placement: tuple[str, ...]
    rooms: tuple[tuple[RunningWorkload, tuple[str, ...]], ...]


def move_cost(r: RunningWorkload, now: float) -> float:
    """GPU-seconds a move of `r` at `now` costs: its work since the last checkpoint and
    a restore."""
    return r.work_lost(now) + RESTORE_S * r.gang.total.gpus


class Defragmenter:
    """Finds moves for gangs across one cycle (remembers shapes it could not help and
    who is already going)."""

    def __init__(self, c: Cycle, gone: set[str], max_lost_s: float) -> None:
        self.c = c
        self.gone = gone  # shared with the cycle's Reclaimer: nobody is stopped twice
        self.max_lost_s = max_lost_s
        self.failed: dict[tuple, float] = {}  # shape -> the largest loss tried in vain

    def defrag(self, g: GangRequest, pool: str) -> Moves | None:
        """Moves that give `g` room in `pool` now (taken in the cycle's free index and
        its quota charged), or None (nothing changed)."""
        c = self.c
        shape = (pool, g.team, g.priority, g.workers, g.per_worker, g.gpu_model, g.locality)
        limit = min(max(self.max_lost_s, c.clock - g.submitted_at), 3 * self.max_lost_s)
        if self.failed.get(shape, -1.0) >= limit or c.index.pool_free_gpus(pool) < g.total.gpus:
            return None
        by_node = self._candidates(g, pool, limit)
        freed: list[RunningWorkload] = []
        seen: set[str] = set()
        placement = None
        for _, node_id in sorted((cost, node) for node, (cost, _) in by_node.items()):
            for r in by_node[node_id][1]:
                if r.workload_id not in seen:
                    seen.add(r.workload_id)
                    c.index.release(r.placement, r.gang.per_worker)
                    freed.append(r)
            placement = c.index.place(g, pool)
            if placement is not None:
                break
        movers = self._spare(g, pool, freed) if placement is not None else freed
        placement = c.index.place(g, pool) if placement is not None else None
        for r in movers:  # theirs until they have stopped (and back, if nothing moves)
            c.index.take(r.placement, r.gang.per_worker)
        if placement is None:
            self.failed[shape] = limit
            return None
        kept = keep_free_room(c.index, g, placement, movers)  # the gang's free room
        rooms = self._rehome(movers, pool, frozenset(placement))
        if rooms is None:
            for node_id, room in kept:
                c.index.release((node_id,), room)
            self.failed[shape] = limit
            return None
        c.book.charge(g.team, pool, g.total)
        self.gone.update(r.workload_id for r in movers)
        return Moves(placement, rooms)

    def _candidates(self, g: GangRequest, pool: str, limit: float):
        """node id -> (cost of moving all its candidates, those candidates, cheapest
        first), for nodes that hold at least one. A mover runs on one node, is smaller
        than `g`, of no higher priority, and checkpointed within `limit` seconds."""
        c, now = self.c, self.c.clock
        out: dict[str, tuple[float, list]] = {}
        for r in c.running_in(pool):
            if (
                not r.gang.preemptible
                or r.workload_id in self.gone
                or r.gang.total.gpus >= g.total.gpus
                or r.gang.priority > g.priority
                or len(set(r.placement)) != 1
                or now - r.last_checkpoint(now) > limit
            ):
                continue
            cost = move_cost(r, now)
            node_id = r.placement[0]
            total, members = out.get(node_id, (0.0, []))
            members.append((cost, r.workload_id, r))
            out[node_id] = (total + cost, members)
        for _, members in out.values():
            members.sort(key=lambda m: m[:2])
        return {n: (t, [m[2] for m in ms]) for n, (t, ms) in out.items()}

    def _spare(self, g: GangRequest, pool: str, freed: list[RunningWorkload]):
        """The freed candidates the gang needs: each, last freed first, is put back
        when the gang can still be placed without its room."""
        index, kept = self.c.index, []
        for r in reversed(freed):
            index.take(r.placement, r.gang.per_worker)
            if index.place(g, pool) is None:
                index.release(r.placement, r.gang.per_worker)
                kept.append(r)
        return kept[::-1]

    def _rehome(self, movers: list[RunningWorkload], pool: str, avoid: frozenset[str]):
        """A new placement for every mover, largest first, off the gang's nodes (taken);
        None, with nothing taken, when one does not fit."""
        index, rooms = self.c.index, []
        for r in sorted(movers, key=lambda r: (-r.gang.total.gpus, r.workload_id)):
            where = index.place(r.gang, pool, avoid)
            if where is None:
                for m, placed in rooms:
                    index.release(placed, m.gang.per_worker)
                return None
            index.take(where, r.gang.per_worker)
            rooms.append((r, where))
        return tuple(rooms)
