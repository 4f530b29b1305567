"""Preemption to give a team its guarantee back (Kueue: reclaim within the cohort).

Victims, for a gang that is within its team's guarantee but finds no room, are chosen
from the same pool in this order:
1. workloads of other teams while that team borrows (its usage is above its guarantee),
   then workloads of the gang's own team with a lower priority;
2. lower priority first;
3. least work lost since the last checkpoint first (Tiresias/Gandiva-style cheap
   suspension), then the most recently started.
Victims are taken in that order until the gang fits, then any victim the gang turns out
not to need is spared (checked newest-taken first).

Fair-share reclaim (`reclaim(..., share=True)`, after Kueue's fair-sharing preemption with
its LessThanOrEqualToFinalShare strategy): a gang that would take its team above its
guarantee, while the team holds less than its guarantee and the gang is no larger than
it, may preempt other teams' borrowed work as long as its team's share after admitting
it (GPUs held / guarantee) stays at or below the victim team's share after the victim
stops, and its quota admits it as borrowing then. So a team whose gangs are large is
not held below its guarantee by teams far above theirs; and two teams cannot preempt
each other back and forth (each preemption leaves the preemptor's share no higher than
the victim's, which the victim would have to exceed to preempt back).

Invariants: only preemptible workloads are chosen; a team stops being a victim as soon
as its tentative usage is no longer above its guarantee; nothing is placed on the
victims' room in the cycle that preempts them (they hold it until they have stopped),
nor on the free room the gang counts on besides theirs (taken for it: the rest of those
nodes stays usable);
the gang's quota is charged, so two gangs never claim the same victims. The gang
itself waits: it starts in a later cycle, once the victims have stopped.
"""

from __future__ import annotations

from collections import Counter

from aicluster.core.model import GangRequest, Preempt, Res, RunningWorkload
from aicluster.core.policies.base import Cycle


def _victim_key(r: RunningWorkload, g: GangRequest, now: float) -> tuple:
    own = r.gang.team == g.team
    return (own, r.gang.priority, r.work_lost(now), -r.started_at, r.workload_id)


def _eligible(c: Cycle, g: GangRequest, r: RunningWorkload, gone: set[str]) -> bool:
    if not r.gang.preemptible or r.workload_id in gone:
        return False
    if r.gang.team == g.team:
        return r.gang.priority < g.priority
    return c.book.is_borrowing(r.gang.team, r.pool)


def held_share(c: Cycle, team: str, pool: str, more: float = 0.0) -> float:
    """GPUs the team holds in `pool` (tentatively, plus `more`) / its guarantee there
    (infinite without a guarantee: such a team has no claim, its work is best effort)."""
    a = c.book.account(team, pool)
    if a.guaranteed <= 0:
        return float("inf")
    return (a.used.gpus + more) / a.guaranteed


def _share_eligible(c: Cycle, g: GangRequest, r: RunningWorkload, gone: set[str]) -> bool:
    """A fair-share victim: another team's borrowed work whose team, once it has stopped,
    still holds at least the share `g`'s team will hold with `g` (module docstring)."""
    if not r.gang.preemptible or r.workload_id in gone or r.gang.team == g.team:
        return False
    if not c.book.is_borrowing(r.gang.team, r.pool):
        return False
    mine = held_share(c, g.team, r.pool, g.total.gpus)
    return held_share(c, r.gang.team, r.pool, -r.gang.total.gpus) >= mine


def share_reclaim_allowed(c: Cycle, g: GangRequest, pool: str) -> bool:
    """`g` may fair-share reclaim in `pool`: its team holds less than its guarantee there,
    and the gang is no larger than the guarantee."""
    a = c.book.account(g.team, pool)
    return a.used.gpus < a.guaranteed and g.total.gpus <= a.guaranteed


def preemption_shape(g: GangRequest, pool: str, rank) -> tuple:
    """What decides whether preempting for `g` in `pool` can succeed: gangs of the same
    shape and `rank` (its priority, or a policy's own rank) find the same victims."""
    return (pool, g.team, rank, g.workers, g.per_worker, g.gpu_model, g.locality)


class Reclaimer:
    """Chooses victims across one cycle (remembers who is already going)."""

    def __init__(self, c: Cycle) -> None:
        self.c = c
        self.gone: set[str] = set()
        self.failed: set[tuple] = set()
        # of the last reclaim that succeeded: its victims, and the nodes its room is on
        # (the victims' and those it would place the gang on)
        self.victims: list[RunningWorkload] = []
        self.room: frozenset[str] = frozenset()
        self.placement: tuple[str, ...] = ()  # where it would place the gang

    def reclaim(self, g: GangRequest, pool: str, share: bool = False) -> int:
        """Preempt for `g` in `pool`; the number of victims (0: not possible now).
        `share`: a fair-share reclaim (module docstring) for a gang beyond its team's
        guarantee."""
        shape = (share, *preemption_shape(g, pool, g.priority))
        if shape in self.failed:
            return 0
        c = self.c
        may_stop = _share_eligible if share else _eligible
        cands = [r for r in c.running_in(pool) if may_stop(c, g, r, self.gone)]
        if sum(r.gang.total.gpus for r in cands) + c.index.pool_free_gpus(pool) < g.total.gpus:
            self.failed.add(shape)
            return 0
        cands.sort(key=lambda r: _victim_key(r, g, c.clock))
        fits = self._fits_sharing if share else self._fits
        taken: list[RunningWorkload] = []
        for r in cands:
            if not may_stop(c, g, r, self.gone):
                continue
            self._free(r)
            taken.append(r)
            if fits(g, pool):
                return self._commit(g, pool, self._spare(g, pool, taken, fits))
        for r in reversed(taken):
            self._hold(r)
        self.failed.add(shape)
        return 0

    def _fits(self, g: GangRequest, pool: str) -> bool:
        return self.c.index.place(g, pool) is not None

    def _fits_sharing(self, g: GangRequest, pool: str) -> bool:
        """Room, and the quota admits `g` borrowing once the victims taken have stopped."""
        c = self.c
        return (
            c.book.admissible(g.team, pool, g.total, borrow=True) is None
            and c.index.place(g, pool) is not None
        )

    def _free(self, r: RunningWorkload) -> None:
        self.c.index.release(r.placement, r.gang.per_worker)
        self.c.book.refund(r.gang.team, r.pool, r.gang.total)

    def _hold(self, r: RunningWorkload) -> None:
        self.c.index.take(r.placement, r.gang.per_worker)
        self.c.book.charge(r.gang.team, r.pool, r.gang.total)

    def _spare(self, g: GangRequest, pool: str, taken: list[RunningWorkload], fits):
        kept = []
        for r in reversed(taken):
            self._hold(r)
            if not fits(g, pool):
                self._free(r)
                kept.append(r)
        return kept[::-1]

    def _commit(self, g: GangRequest, pool: str, victims: list[RunningWorkload]) -> int:
        c = self.c
        c.book.charge(g.team, pool, g.total)
        placement = c.index.place(g, pool) or ()
        self.victims, self.placement = victims, placement
        self.room = frozenset(placement).union(*(r.placement for r in victims))
        for r in victims:
            c.index.take(r.placement, r.gang.per_worker)  # theirs until they have stopped
            self.gone.add(r.workload_id)
            why = (
                f"lower priority than {g.workload_id} of the same team"
                if r.gang.team == g.team
                else f"team {r.gang.team} borrows beyond its guarantee in pool {pool}"
            )
            c.preempts.append(
                Preempt(
                    r.workload_id,
                    f"preempted for {g.workload_id} of team {g.team}: {why}",
                )
            )
        keep_free_room(c.index, g, placement, victims)
        return len(victims)


def keep_free_room(index, g: GangRequest, placement, victims) -> list[tuple[str, Res]]:
    """Take, on each node of the gang's placement, the part of its need that its victims
    (held until they have stopped) do not free there: free room it counts on, which
    nothing else may take this cycle (the rest of the node stays usable). What it took,
    (node id, room), for a caller that may have to give it back."""
    taken = []
    for node_id, k in Counter(placement).items():
        need = g.per_worker.scale(k)
        have = Res()
        for r in victims:
            n = r.placement.count(node_id)
            if n:
                have = have + r.gang.per_worker.scale(n)
        short = Res(
            max(0.0, need.cpus - have.cpus),
            max(0, need.memory - have.memory),
            max(0, need.gpus - have.gpus),
        )
        if short != Res():
            index.take((node_id,), short)
            taken.append((node_id, short))
    return taken
