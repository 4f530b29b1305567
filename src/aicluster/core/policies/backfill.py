"""`backfill`: `fifo` partitions with EASY backfill (Lifka's Argonne scheduler, as in Slurm).

Gangs are tried in FCFS order as in `fifo`. The first gang of a pool that waits for room
gets a *reservation*: the earliest time (the *shadow time*) at which it would fit if
running workloads end at their runtime limits (`started_at + runtime_limit`; a workload
without a limit never ends, as far as the plan knows). A later gang, of any partition,
may start now only if it does not delay that reservation: it ends (by its own runtime
limit) before the shadow time, or the reserved gang would still fit at the shadow time
beside it. A partition whose head waits for its *quota* lets a later gang of its own
start on the same terms, against the time its running work frees enough quota.

Invariants: everything `fifo` guarantees about capacity and quotas; given correct
runtime limits, no backfilled gang delays the start of a pool's reserved gang; without
limits, a gang only starts beside the reservation, never on the nodes it needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aicluster.core.model import Admit, Decision, GangRequest, Snapshot, WaitKind
from aicluster.core.policies.base import Cycle, Refusal, arrival_key
from aicluster.core.policies.fifo import (
    hold_for_starving,
    partition_never_fits,
    partition_of,
)
from aicluster.core.topology import FreeIndex, why_no_room

INF = float("inf")


def _end(g: GangRequest, start: float) -> float:
    return start + g.runtime_limit if g.runtime_limit is not None else INF


def _outlives(g: GangRequest, start: float, time: float) -> bool:
    """True unless `g`, started at `start`, surely ends by `time`: a gang without a limit
    outlives every time, an infinite one included (INF > INF is False, so say it)."""
    end = _end(g, start)
    return end == INF or end > time


class Reservation:
    """The shadow time and free capacity at that time for a pool's reserved gang."""

    def __init__(self, c: Cycle, head: GangRequest, pool: str) -> None:
        self.head, self.pool = head, pool
        self.shadow = FreeIndex(c.snapshot.nodes, layout=c.layout)
        gangs = {g.workload_id: g for g in c.snapshot.pending}
        ending = [
            (_end(r.gang, r.started_at), r.workload_id, r.placement, r.gang)
            for r in c.running_in(pool)
        ]
        for d in c.decided:
            if isinstance(d, Admit) and c.index.node[d.placement[0]].pool == pool:
                g = gangs[d.workload_id]
                self.shadow.take(d.placement, g.per_worker)
                ending.append((_end(g, c.clock), d.workload_id, d.placement, g))
        self.time = c.clock
        fits = self.shadow.place(head, pool) is not None
        for end, _, placement, g in sorted(ending, key=lambda e: (e[0], e[1])):
            if fits:
                break
            self.shadow.release(placement, g.per_worker)
            self.time = end
            fits = self.shadow.place(head, pool) is not None
        if not fits:
            self.time = INF
        planned = self.shadow.place(head, pool)
        self.nodes = frozenset(planned or ())  # where the head will go at the shadow time

    def allows(self, g: GangRequest, placement: tuple[str, ...], now: float) -> bool:
        """True if `g` starting now on `placement` leaves the reservation intact (and
        then counts it in the free capacity at the shadow time)."""
        if _end(g, now) <= self.time < INF:
            return True
        self.shadow.take(placement, g.per_worker)
        if self.shadow.place(self.head, self.pool) is not None:
            return True
        self.shadow.release(placement, g.per_worker)
        return False


class _QuotaHold:
    """A partition whose head waits for its quota: when its running work (by runtime
    limits) frees enough for the head, and the quota to spare then (computed lazily)."""

    def __init__(self, c: Cycle, head: GangRequest, pool: str) -> None:
        self.c, self.head, self.pool = c, head, pool
        self._shadow: list[float] | None = None
        # the reason of every gang held behind it (one sentence, made once)
        self.behind = f"queued behind {head.workload_id} (starting now would delay it)"

    def shadow(self) -> list[float]:
        """[time, spare GPUs]; `spare` shrinks as gangs outliving `time` start."""
        if self._shadow is None:
            c, head = self.c, self.head
            size = c.book.partition_size(head.team, self.pool)
            ends = sorted(
                (_end(r.gang, r.started_at), r.gang.total.gpus)
                for r in c.running_of(head.team, self.pool)
            )
            used = c.book.account(head.team, self.pool).used.gpus
            time = c.clock
            for end, gpus in ends:
                if used + head.total.gpus <= size:
                    break
                used, time = used - gpus, end
            self._shadow = [time, size - used - head.total.gpus]
        return self._shadow


@dataclass(frozen=True)
class BackfillPolicy:
    name: str = "backfill"
    starve_after_s: float = 6 * 3600.0
    memo: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    def plan(self, snapshot: Snapshot, clock: float) -> list[Decision]:
        c = Cycle(snapshot, clock, self.memo)
        reserved: dict[str, Reservation] = {}
        # partitions whose head waits for quota, and the fewest GPUs their quota refused
        quota_wait: dict[tuple, _QuotaHold] = {}
        quota_full: dict[tuple, int] = {}
        parts: dict[tuple, tuple] = {}
        wait, behind = c.wait, WaitKind.QUEUED_BEHIND
        for g in sorted(snapshot.pending, key=arrival_key):
            part = parts.get((g.team, g.pool))
            if part is None:
                part = parts[(g.team, g.pool)] = partition_of(c, g)
            hold = quota_wait.get(part)
            if hold is not None:  # may it start ahead of the quota-blocked head? (most gangs
                # of a full partition stop here: decided inline, no call per gang)
                gpus = g.total.gpus
                if gpus >= quota_full[part]:
                    wait(g, hold.behind, behind)  # the quota refuses it now anyway
                    continue
                time, spare = hold.shadow()
                if gpus > spare and _outlives(g, clock, time):
                    wait(g, hold.behind, behind)
                    continue
            refusal = self._try(c, g, reserved)
            if refusal is None:
                if hold is not None and _outlives(g, clock, hold.shadow()[0]):
                    hold.shadow()[1] -= g.total.gpus
                continue
            capped = refusal.kind is WaitKind.TEAM_CAP  # its team's alone: blocks no one
            if not refusal.room and not capped:
                quota_full[part] = min(g.total.gpus, quota_full.get(part, g.total.gpus))
            never = c.never_fits(g) or partition_never_fits(c, g)
            if never:
                c.never(g, never)
                continue
            reason, room, kind = refusal
            if room and hold is None:
                self._reserve(c, g, reserved)
                if hold_for_starving(c, g, self.starve_after_s):
                    reason += "; nodes are held for it"
            elif not room and hold is None and not capped:
                quota_wait[part] = _QuotaHold(c, g, c.pools_for(g)[0])
            c.wait(g, reason, kind)
        return c.decisions()

    @staticmethod
    def _reserve(c: Cycle, g: GangRequest, reserved: dict[str, Reservation]) -> None:
        for pool in c.pools_for(g):
            if pool in c.index.pools and pool not in reserved:
                reserved[pool] = Reservation(c, g, pool)
                return

    @staticmethod
    def _try(c: Cycle, g: GangRequest, reserved: dict[str, Reservation]):
        """Like `Cycle.try_admit` with the fifo partition rule, but never delaying a
        pool's reservation. None if admitted, else why not (a `Refusal`)."""
        capped = c.book.over_cap(g.team, g.total)
        if capped is not None:
            return Refusal(capped, False, WaitKind.TEAM_CAP)
        quota: str | None = None
        room: tuple[WaitKind, str] | None = None
        for pool in c.pools_for(g):
            if pool not in c.index.pools:
                continue
            reason = c.book.fits_partition(g.team, pool, g.total)
            if reason is not None:
                quota = quota or reason
                continue
            placement = c.index.place(g, pool)
            if placement is None:
                room = room or why_no_room(c.index, g, pool)
                continue
            res = reserved.get(pool)
            if res is not None and not res.allows(g, placement, c.clock):
                placement = c.index.place(g, pool, avoid=res.nodes)  # beside the head
                if placement is None or not res.allows(g, placement, c.clock):
                    room = room or (
                        WaitKind.BACKFILL_RESERVATION,
                        f"waiting: starting now would delay {res.head.workload_id}",
                    )
                    continue
            c.admit(g, pool, placement)
            return None
        if room is not None:
            return Refusal(room[1], True, room[0])
        if quota is not None:
            return Refusal(quota, False, WaitKind.QUOTA)
        return Refusal("no pool can take it", False, WaitKind.CAPACITY)
