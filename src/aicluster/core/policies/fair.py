"""`fair` (the default): guarantees first, then fair borrowing, preemption, LAS order.

One cycle, in two passes over the pending gangs:

1. *Guaranteed pass*, in queue order. A gang that fits within its team's guarantee in a
   pool is placed; if there is no room and preemption is on, borrowed (or, within the
   team, lower-priority) work is preempted to make room (see `preemption`).
2. *Borrowing pass*: the gangs left over need GPUs above their team's guarantee. Teams
   take turns, the one with the smallest weighted share of borrowed GPUs first (dominant
   resource fairness over GPUs, weights from `Quota.weight`); each turn tries the team's
   next gang against its borrowing limit, the cohort's lendable GPUs and the nodes.
   A gang that does not fit is skipped (work conserving), with the reason recorded.

Queue order (both passes, within a team): starving gangs first, then priority class,
then least attained service (Tiresias-style discretised LAS over GPU-seconds run in
earlier attempts: a preempted long job yields to new work, without knowing durations),
then arrival. No starvation: a gang waiting `starve_after_s` goes first and, if it
still cannot start, nodes are held for it (nothing else starts on them) and, when it
needs to borrow, its cohort lends to nobody else until it has started. A starving gang
beyond what is left of its team's guarantee tries to borrow at once, in its turn; if its
quota refuses it, the team's later gangs in the pools where it has a quota wait behind
it, so that smaller gangs of the same team cannot keep taking the guarantee it needs.

Reservations (decision state kept across cycles, in `reservations`, unlike `memo`,
which only saves work): the room a guaranteed gang freed by preempting is kept for it.
Each cycle first tries the gangs that hold a reservation, before any other gang (starving
borrowers included), in the pool they preempted in; while victims are still stopping,
their nodes are held and the gang's guarantee charged, so nothing else takes the room and
nothing new is preempted for it (the victims still running are asked to stop again). A reservation ends when its gang is admitted, leaves
the queue (or the policy's view), is refused by its quota (guarantee + what its cohort
lends: a gang of its team admitted since may hold part of the guarantee), or cannot fit
although every victim has stopped (or `reserve_for_s` has passed): it can no longer help.
Without it, the next cycle gave the freed room to a starving borrower tried first, which
the guaranteed gang preempted again, for ever.

Defragmentation (`defrag`): a gang within its team's guarantee that finds no room,
when reclaiming borrowed work is not enough but its pool has the free GPUs it needs
scattered over nodes, moves cheap checkpointable work (any team's: see `defrag`) to
other nodes and takes the room they leave. The gang holds a reservation as above (the
movers are its victims); each mover holds one for the room it moves to (`Moved`), kept
while it stops and tried right after the gangs' in the next cycle, so it starts again
at once, within its team's guarantee as before. Without it, a team whose gangs need
whole nodes held a fraction of its guarantee while other teams' small guaranteed jobs
left a few GPUs free on every node.

Invariants: guarantee + borrowing limit is never exceeded; a gang within its team's
guarantee is never kept out by borrowed work for longer than the preemption takes; work
preempted for a gang is preempted once: in the next cycle after its victims have
stopped, that gang is admitted (or its reservation ends for one of the reasons above).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field
from heapq import heappop, heapreplace
from typing import NamedTuple

from aicluster.core.model import Decision, GangRequest, Preempt, Res, Snapshot, Wait, WaitKind
from aicluster.core.policies.base import Cycle, Refusal, kept_by_object
from aicluster.core.policies.defrag import Defragmenter, Moves
from aicluster.core.policies.fifo import hold_for_starving
from aicluster.core.policies.preemption import Reclaimer, share_reclaim_allowed


@dataclass(frozen=True)
class FairPolicy:
    name: str = "fair"
    preemption: bool = True
    las_thresholds: tuple[float, ...] = (
        3600.0,
        10 * 3600.0,
    )  # GPU-seconds per LAS level
    starve_after_s: float = 6 * 3600.0
    reserve_for_s: float = 900.0  # the longest a reservation waits for its victims to stop
    defrag: bool = True  # move cheap work to give a guaranteed gang its shape (`defrag`)
    move_max_lost_s: float = 600.0  # a mover's last checkpoint is at most this old
    memo: dict = field(default_factory=dict, compare=False, repr=False, hash=False)
    # workload id -> FreedRoom: decisions depend on it (see the module docstring)
    reservations: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    def order_key(self, g: GangRequest, clock: float) -> tuple:
        starving = clock - g.submitted_at >= self.starve_after_s
        level = bisect_right(self.las_thresholds, g.attained_service)
        return (not starving, -g.priority, level, g.submitted_at, g.workload_id)

    def plan(self, snapshot: Snapshot, clock: float) -> list[Decision]:
        c = Cycle(snapshot, clock, self.memo)
        reclaimer = Reclaimer(c) if self.preemption else None
        mover = (
            Defragmenter(c, reclaimer.gone, self.move_max_lost_s)
            if reclaimer is not None and self.defrag
            else None
        )
        deferred: dict[str, list[tuple[tuple, GangRequest]]] = {}  # team -> (key, gang)s
        closed: dict[tuple, str] = {}  # (cohort, pool) -> starving gang it lends to only
        kept: dict[tuple, str] = {}  # (team, pool) -> starving gang its GPUs are kept for
        decided = self._reserved(c, reclaimer)
        for key, g in self._in_order(snapshot.pending, clock):
            if decided and g.workload_id in decided:
                continue
            ahead = (
                next((kept[(g.team, p)] for p in c.pools_for(g) if (g.team, p) in kept), None)
                if kept
                else None
            )
            if ahead is not None:
                c.wait(
                    g,
                    f"queued behind {ahead} (team {g.team}'s GPUs are kept for it: it starves)",
                    WaitKind.QUEUED_BEHIND,
                )
                continue
            pools = _within_guarantee(c, g)
            if pools:
                self._guaranteed(c, g, pools, reclaimer, mover)
            elif clock - g.submitted_at >= self.starve_after_s:
                refusal = self._borrow(c, g, closed, reclaimer)
                if _quota_refused(refusal):  # its team's quota is in use
                    for p in c.pools_for(g):
                        if c.book.has_quota(g.team, p):
                            kept[(g.team, p)] = g.workload_id
            else:
                deferred.setdefault(g.team, []).append((key, g))
        self._borrowing(c, deferred, closed, reclaimer)
        return c.decisions()

    def _in_order(self, pending: tuple, clock: float) -> list[tuple[tuple, GangRequest]]:
        """(key, gang) in `order_key` order, where key is the order key without its
        starving flag (what the borrowing pass compares: none of its gangs starves).

        The key of a gang is kept across cycles (`kept_by_object`): only the starving
        flag depends on the clock, and sorting by the kept keys then putting the starving
        gangs first (in the same order) is sorting by `order_key`, whose keys are unique
        (they end with the id)."""
        keyed = [made for _, made in kept_by_object(self.memo, "order_keys", pending, self._keyed)]
        keyed.sort()
        starve = self.starve_after_s
        starving = [e for e in keyed if clock - e[1].submitted_at >= starve]
        if not starving:
            return keyed
        return starving + [e for e in keyed if clock - e[1].submitted_at < starve]

    def _keyed(self, g: GangRequest) -> tuple[tuple, GangRequest]:
        """(order key without the starving flag, the gang)."""
        level = bisect_right(self.las_thresholds, g.attained_service)
        return (-g.priority, level, g.submitted_at, g.workload_id), g

    def _guaranteed(
        self, c: Cycle, g: GangRequest, pools: list[str], reclaimer, mover=None
    ) -> None:
        rule = lambda g, pool: c.book.admissible(g.team, pool, g.total, borrow=False)
        refusal = c.try_admit(g, rule, pools, memo=("guaranteed",))
        if refusal is None:
            return
        never = c.never_fits(g)
        if never:
            c.never(g, never)
            return
        for pool in pools if reclaimer is not None else ():
            if reclaimer.reclaim(g, pool):
                self._preempting(c, g, pool, reclaimer, "its guaranteed GPUs")
                return
        for pool in pools if mover is not None else ():
            moves = mover.defrag(g, pool)
            if moves is not None:
                self._moving(c, g, pool, moves)
                return
        self._wait_starving(c, g, refusal)

    def _preempting(self, c: Cycle, g: GangRequest, pool: str, reclaimer, what: str) -> None:
        """`g` waits for the victims `reclaimer` just chose, their room kept for it."""
        victims = reclaimer.victims
        self.reservations[g.workload_id] = FreedRoom(
            pool,
            frozenset(r.workload_id for r in victims),
            reclaimer.room,
            c.clock,
            reclaimer.placement,
        )
        c.wait(
            g,
            f"preempting {len(victims)} workload(s) to give team {g.team} {what} in pool {pool}",
            WaitKind.PREEMPTING,
        )

    def _share_reclaim(self, c: Cycle, g: GangRequest, reclaimer, closed: dict) -> bool:
        """A gang beyond what is left of its team's guarantee, while the team holds less
        than its guarantee: preempt borrowed work of teams holding a larger share
        (`preemption`, fair-share reclaim; not where its cohort lends to a starving gang
        first); True if it did."""
        for pool in c.pools_for(g):
            if (
                pool in c.index.pools
                and (c.book.account(g.team, pool).cohort, pool) not in closed
                and share_reclaim_allowed(c, g, pool)
                and reclaimer.reclaim(g, pool, share=True)
            ):
                self._preempting(c, g, pool, reclaimer, "its fair share of its guarantee")
                return True
        return False

    def _moving(self, c: Cycle, g: GangRequest, pool: str, moves: Moves) -> None:
        """Stop the movers, keep the room for `g` and each mover's new room for it."""
        self.reservations[g.workload_id] = FreedRoom(
            pool,
            frozenset(r.workload_id for r, _ in moves.rooms),
            frozenset(moves.placement),
            c.clock,
            moves.placement,
        )
        for r, where in moves.rooms:
            self.reservations[r.workload_id] = Moved(pool, where, r.gang.per_worker, c.clock)
            c.preempts.append(
                Preempt(
                    r.workload_id,
                    f"moved to other nodes for {g.workload_id} of team {g.team}, which "
                    f"needs {g.workers} x {g.per_worker.gpus} GPUs together in pool {pool}; "
                    "it starts again at once from its last checkpoint",
                    move=True,
                )
            )
        c.wait(
            g,
            f"moving {len(moves.rooms)} workload(s) to other nodes to give team {g.team} "
            f"its guaranteed GPUs in the shape it needs in pool {pool}",
            WaitKind.PREEMPTING,
        )

    def _reserved(self, c: Cycle, reclaimer) -> set[str]:
        """Decide the gangs holding a reservation, first: admitted in its pool, or waiting
        with its victims' nodes held while they stop; the ids decided. Ends reservations
        that can no longer help (module docstring)."""
        held = self.reservations
        if not held:
            return set()
        pending = {g.workload_id: g for g in c.snapshot.pending}
        self._movers_stopping(c, pending, reclaimer)
        for res in held.values():  # a mover's new room, kept while it stops and until
            if isinstance(res, Moved) and res.pool in c.index.pools:  # it is tried below
                c.index.take(res.placement, res.per_worker)
        decided: set[str] = set()
        # its quota as any gang's: a gang of its team admitted after the preemption, above
        # the guarantee then charged to this one, has since become the one that borrows
        rule = lambda g, pool: c.book.admissible(g.team, pool, g.total, borrow=True)
        ordered = sorted(
            (pending[w] for w in held if w in pending),  # a mover may still be stopping
            key=lambda g: self.order_key(g, c.clock),
        )
        for g in ordered:  # the gangs first, then the movers (their new room is kept)
            if isinstance(held[g.workload_id], FreedRoom):
                self._reserved_gang(c, g, rule, reclaimer, decided)
        for g in ordered:
            res = held.get(g.workload_id)
            if isinstance(res, Moved):
                del held[g.workload_id]  # it starts now, or waits as any gang
                if res.pool in c.index.pools:
                    c.index.release(res.placement, res.per_worker)
                    if c.try_admit(g, rule, [res.pool]) is None:
                        decided.add(g.workload_id)
        return decided

    def _movers_stopping(self, c: Cycle, pending: dict, reclaimer) -> None:
        """Forget reservations of gangs that left the queue (admitted, or gone) and of
        movers that neither stop nor wait (or waited for too long); a mover still
        stopping keeps its room and is asked to stop again."""
        held = self.reservations
        for wid in [w for w in held if w not in pending]:
            res = held.pop(wid)
            if not isinstance(res, Moved) or c.clock - res.since > self.reserve_for_s:
                continue
            r = next((r for r in c.running_in(res.pool) if r.workload_id == wid), None)
            if r is None:
                continue  # ended, or left the policy's view
            held[wid] = res
            c.preempts.append(Preempt(wid, "moved: still running", move=True))
            if reclaimer is not None:
                reclaimer.gone.add(wid)

    def _reserved_gang(self, c: Cycle, g: GangRequest, rule, reclaimer, decided: set) -> None:
        """A gang holding the room preempted (or moved) for it: admitted there, or
        waiting with the room held while its victims stop, or its reservation ended."""
        held, wid = self.reservations, g.workload_id
        res = held[wid]
        if res.pool not in c.index.pools:
            del held[wid]
            return
        if res.placement and rule(g, res.pool) is None and _fits_on(c, g, res.placement):
            c.admit(g, res.pool, res.placement)  # where it was planned: the rooms of gangs
            del held[wid]  # preempted for in one cycle may share a node
            decided.add(wid)
            return
        refusal = c.try_admit(g, rule, [res.pool])
        if refusal is None:
            del held[wid]
            decided.add(wid)
            return
        stopping = [r for r in c.running_in(res.pool) if r.workload_id in res.victims]
        if not refusal.room or not stopping or c.clock - res.since > self.reserve_for_s:
            del held[wid]  # its quota refuses it now, or no stopping victim holds room
            return
        c.index.hold(res.nodes)
        c.book.charge(g.team, res.pool, g.total)
        for r in stopping:  # asked again (a stop the control plane missed), nobody new
            if not isinstance(held.get(r.workload_id), Moved):  # a mover is asked apart
                c.preempts.append(
                    Preempt(r.workload_id, f"preempted for {wid} of team {g.team}: still running")
                )
        if reclaimer is not None:
            reclaimer.gone.update(r.workload_id for r in stopping)
        c.wait(
            g,
            f"waiting for {len(stopping)} workload(s) preempted for it to stop in pool "
            f"{res.pool} (their room is kept for it)",
            WaitKind.PREEMPTING,
        )
        decided.add(wid)

    def _borrowing(self, c: Cycle, deferred: dict[str, list], closed, reclaimer=None) -> None:
        """Teams in turn, smallest weighted borrowed share first; each turn one gang.

        Most turns at scale refuse a gang for the reason the last gang of its team and
        shape was refused, nothing having changed since (the free index, the quota book
        and `closed` the same): such a gang gets that Wait straight away (`said`), which
        is the decision `_borrow` would make again, word for word (a deferred gang never
        starves this cycle, so its wait has no side effect)."""
        heap = [(c.book.share(t), q[0][0], t) for t, q in deferred.items()]
        heap.sort()
        nxt = dict.fromkeys(deferred, 0)
        said: dict[tuple, tuple] = {}  # (team, shape) -> (versions, len(closed), its Wait)
        index, book, decided = c.index, c.book, c.decided
        while heap:
            team = heap[0][2]
            queue, i = deferred[team], nxt[team]
            g = queue[i][1]
            nxt[team] = i + 1
            hit = said.get((team, g.shape))
            if (
                hit is not None
                and hit[0] == index.version
                and hit[1] == book.version
                and hit[2] == len(closed)
            ):
                decided.append(Wait(g.workload_id, hit[3].reason, hit[3].kind))
            else:
                self._borrow(c, g, closed, reclaimer)
                last = decided[-1] if decided else None
                if (
                    isinstance(last, Wait)
                    and last.workload_id == g.workload_id
                    and last.kind is not WaitKind.PREEMPTING  # its victims are its own
                ):
                    said[(team, g.shape)] = (index.version, book.version, len(closed), last)
            if i + 1 < len(queue):
                heapreplace(heap, (book.share(team), queue[i + 1][0], team))
            else:
                heappop(heap)

    def _borrow(self, c: Cycle, g: GangRequest, closed: dict, reclaimer=None) -> Refusal | None:
        """Admit `g` borrowing above its team's guarantee, or preempt for it by fair
        share, or record why it waits (the Refusal; None when admitted, preempted for,
        or when it could never fit). (Moving work for a starving borrower's shape was
        tried and left out: on Philly it halved the longest wait but cost the team of
        big gangs its fair share, 0.89 -> 0.39 of its guarantee.)"""
        refusal = c.try_admit(
            g,
            lambda g, pool: self._borrow_rule(c, g, pool, closed),
            memo=("borrow", len(closed)),  # `closed` only grows within a cycle
        )
        if refusal is None:
            return None
        never = c.never_fits(g) or _beyond_ceiling(c, g)
        if never:
            c.never(g, never)
            return None
        if (
            reclaimer is not None
            and refusal.kind is not WaitKind.TEAM_CAP
            and self._share_reclaim(c, g, reclaimer, closed)
        ):
            return None
        self._wait_starving(c, g, refusal, closed)
        return refusal

    @staticmethod
    def _borrow_rule(c: Cycle, g: GangRequest, pool: str, closed: dict) -> str | None:
        cohort = c.book.account(g.team, pool).cohort
        holder = closed.get((cohort, pool))
        if holder is not None:
            return f"cohort {cohort} lends its idle GPUs in pool {pool} to {holder} first"
        return c.book.admissible(g.team, pool, g.total, borrow=True)

    def _wait_starving(self, c: Cycle, g, refusal: Refusal, closed=None) -> None:
        reason, room, kind = refusal
        if c.clock - g.submitted_at >= self.starve_after_s:
            if room and hold_for_starving(c, g, 0.0):
                reason += "; nodes are held for it"
            elif _quota_refused(refusal) and closed is not None:
                for pool in c.pools_for(g):
                    key = (c.book.account(g.team, pool).cohort, pool)
                    closed.setdefault(key, g.workload_id)
        c.wait(g, reason, kind)


class FreedRoom(NamedTuple):
    """Room preempted for a gang: the pool, the victims' ids, the nodes its room is on
    (the victims' and those it was to be placed on), when, and the placement it was
    planned on (tried first once its victims have stopped)."""

    pool: str
    victims: frozenset[str]
    nodes: frozenset[str]
    since: float
    placement: tuple[str, ...] = ()


def _fits_on(c: Cycle, g: GangRequest, placement: tuple[str, ...]) -> bool:
    """The gang's workers fit the free room of `placement`'s nodes now."""
    index = c.index
    for node_id, k in Counter(placement).items():
        if node_id not in index.node or node_id in index.held:
            return False
        if g.per_worker.count_in(index.free[node_id]) < k:
            return False
    return True


class Moved(NamedTuple):
    """Room kept for a mover (`defrag`): its pool, the placement it moves to, its
    workers' size, and when it was moved."""

    pool: str
    placement: tuple[str, ...]
    per_worker: Res
    since: float


def _quota_refused(refusal: Refusal | None) -> bool:
    """True when a quota rule refused the gang (not room, not its team's own cap: a gang
    its cap holds back is kept from no one else's GPUs and nodes)."""
    return refusal is not None and not refusal.room and refusal.kind is not WaitKind.TEAM_CAP


def _within_guarantee(c: Cycle, g: GangRequest) -> list[str]:
    """The pools where the gang fits what is left of its team's guarantee (remembered
    for gangs of its team and shape while the quota book is unchanged: do not change
    the list)."""
    memo = c.scratch.setdefault("within_guarantee", {})
    key = (g.team, g.shape)
    hit = memo.get(key)
    if hit is not None and hit[0] == c.book.version:
        return hit[1]
    pools = [p for p in c.pools_for(g) if c.book.within_guarantee(g.team, p, g.total)]
    memo[key] = (c.book.version, pools)  # the version after: opening an account counts
    return pools


def _beyond_ceiling(c: Cycle, g: GangRequest) -> str | None:
    """Why the gang exceeds guarantee + borrowing limit in every pool it may use
    (remembered for the cycle: it depends on the quotas alone)."""
    memo = c.scratch.setdefault("beyond_ceiling", {})
    key = (g.team, g.pool, g.total.gpus)
    if key not in memo:
        memo[key] = _ceiling_reason(c, g)
    return memo[key]


def _ceiling_reason(c: Cycle, g: GangRequest) -> str | None:
    ceilings = {p: c.book.ceiling(g.team, p) for p in c.pools_for(g)}
    if ceilings and all(g.total.gpus > v for v in ceilings.values()):
        pool, top = max(ceilings.items(), key=lambda kv: kv[1])
        return (
            f"could never fit: needs {g.total.gpus} GPUs but team {g.team} may hold at most "
            f"{top:g} in pool {pool} (guarantee + borrowing limit)"
        )
    return None
