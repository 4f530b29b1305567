"""`las`: Tiresias-style discretised two-dimensional least attained service (2D-LAS).

After Gu et al., "Tiresias: A GPU Cluster Manager for Distributed Deep Learning" (NSDI
2019): a gang's *attained service* is GPUs x time it has run (both dimensions, so a wide
gang climbs as fast as a long one), in GPU-seconds; `thresholds` cut it into priority
queues (queue 0: below the first threshold). One shared queue over the cluster: quotas
are not partitions here (a cluster without quotas is one queue; with quotas, a gang is
only admitted where the quota book allows it, borrowing included, so the ceilings hold).

One cycle, over the pending gangs in order (priority class, queue, arrival, id: FIFO
within a queue):
- a gang that fits starts (work conserving: a gang that does not fit is skipped);
- one that does not fit preempts running gangs of a strictly lower queue (or priority
  class), lowest queue first, then least work lost since their last checkpoint, then the
  latest submitted, until it fits (unneeded victims are spared); it starts in a later
  cycle, once they have stopped (as with `fair`'s reclaim);
- starvation guard, after Tiresias' PromoteKnob: a gang that has run before and has
  waited (time since submission not spent running) at least `promote_knob` x the time
  it has run is promoted to queue 0, and stays there for the whole attempt it then
  starts (our choice: counting that attempt's service let wide gangs climb out in
  minutes and be preempted before their first checkpoint, with no progress). In
  addition, the first gang of queue 0 that has waited `starve_after_s` since submission
  and still finds no room gets nodes held for it (nothing else starts on them), so a
  wide gang is not kept out forever by a stream of small new ones. Thresholds, knob and
  hold are our choices (1 and 10 GPU-hours, 4, 6 hours), not values from the paper.

A running gang's attained service is its earlier attempts' plus GPUs x time since it
started; a pending one's is `GangRequest.attained_service`, which the simulator sets on
preemption. The live control plane does not record it, so this policy is not offered
there (not in `core.scheduler`'s registry): a preempted gang would look new and preempt
its way straight back. It is a baseline of the benchmark (`bench/scheduler.py`), which
shows it the whole queue: behind the simulator's arrival-ordered `queue_depth` window the
gang it preempted for drops out of view once its older victims queue again.

Invariants: what `Cycle` guarantees about capacity and whole gangs; only preemptible
gangs of a strictly lower (priority class, queue) are preempted; nothing is placed on a
victim's room in the cycle that preempts it.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field

from aicluster.core.model import (
    Decision,
    GangRequest,
    Preempt,
    RunningWorkload,
    Snapshot,
    WaitKind,
)
from aicluster.core.policies.base import Cycle, QuotaRule, Refusal, kept_by_object
from aicluster.core.policies.preemption import preemption_shape

VictimWhy = Callable[[RunningWorkload], str]


class RankedPreemptor:
    """Preempts, for a gang that does not fit, victims the caller chose and ordered
    (remembers across one cycle who is already going). Callers offer no gang that
    started at `clock` as a victim: the gang that preempts may drop out of a bounded
    view of the queue (the simulator's `queue_depth`) before it starts, and its room go
    to another, which must not be preempted in turn in the same instant (a livelock)."""

    def __init__(self, c: Cycle, rule: QuotaRule) -> None:
        self.c, self.rule = c, rule
        self.gone: set[str] = set()

    def _fits(self, g: GangRequest, pool: str) -> bool:
        return self.c.index.place(g, pool) is not None and self.rule(g, pool) is None

    def preempt(
        self, g: GangRequest, pool: str, victims: list[RunningWorkload], why: VictimWhy
    ) -> int:
        """Free `victims` (in that order) until `g` fits in `pool` (nodes and quota);
        the number preempted (0: not possible, nothing changed)."""
        c = self.c
        cands = [r for r in victims if r.workload_id not in self.gone and r.pool == pool]
        if sum(r.gang.total.gpus for r in cands) + c.index.pool_free_gpus(pool) < g.total.gpus:
            return 0
        if g.per_worker.gpus > 0 and not self._slots(g, pool, cands):
            return 0  # not even every candidate gone would leave a GPU slot for each rank
        taken: list[RunningWorkload] = []
        for r in cands:
            self._free(r)
            taken.append(r)
            if self._fits(g, pool):
                kept = []
                for v in reversed(taken):  # spare the victims it turns out not to need
                    self._hold(v)
                    if not self._fits(g, pool):
                        self._free(v)
                        kept.append(v)
                c.book.charge(g.team, pool, g.total)
                for v in kept[::-1]:
                    c.index.take(v.placement, v.gang.per_worker)  # theirs until stopped
                    self.gone.add(v.workload_id)
                    c.preempts.append(Preempt(v.workload_id, why(v)))
                return len(kept)
        for r in reversed(taken):
            self._hold(r)
        return 0

    def _slots(self, g: GangRequest, pool: str, cands: list[RunningWorkload]) -> bool:
        """Whether, by GPUs per node alone, `g`'s ranks could find room once every
        candidate is freed (a necessary condition; most refused preemptions fail it, and
        it costs a few dict additions where freeing and taking back costs ~40 us each)."""
        freed: dict[str, float] = {}
        for r in cands:
            each = r.gang.per_worker.gpus
            for node_id in r.placement:
                freed[node_id] = freed.get(node_id, 0) + each
        return self.c.index.slots_if_freed(pool, g.per_worker.gpus, freed) >= g.workers

    def _free(self, r: RunningWorkload) -> None:
        self.c.index.release(r.placement, r.gang.per_worker)
        self.c.book.refund(r.gang.team, r.pool, r.gang.total)

    def _hold(self, r: RunningWorkload) -> None:
        self.c.index.take(r.placement, r.gang.per_worker)
        self.c.book.charge(r.gang.team, r.pool, r.gang.total)


def once(make: Callable[[], list]) -> Callable[[], list]:
    """`make()` computed on the first call only (a cycle's list that it may never need)."""
    made: list[list] = []

    def get() -> list:
        if not made:
            made.append(make())
        return made[0]

    return get


def try_admit(c: Cycle, g: GangRequest, rule: QuotaRule, refused: dict) -> Refusal | None:
    """`Cycle.try_admit`, but a gang of the same team and shape as one already refused
    this cycle is refused at once (free room and quota only shrink within a cycle)."""
    key = (g.team, g.pool, g.workers, g.per_worker, g.gpu_model, g.locality)
    refusal = refused.get(key)
    if refusal is None:
        refusal = c.try_admit(g, rule)
        if refusal is not None:
            refused[key] = refusal
    return refusal


def shared_rule(c: Cycle) -> QuotaRule:
    """One shared queue: any quota only as a ceiling (guarantee + borrowing limit)."""
    return lambda g, pool: c.book.admissible(g.team, pool, g.total, borrow=True)


@dataclass(frozen=True)
class LasPolicy:
    name: str = "las"
    thresholds: tuple[float, ...] = (3600.0, 10 * 3600.0)  # GPU-seconds per queue
    promote_knob: float | None = 4.0  # None: no promotion
    starve_after_s: float = 6 * 3600.0
    preemption: bool = True
    memo: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    def queue_of(self, attained: float, ran: float, waited: float) -> int:
        """The queue of a gang with `attained` GPU-seconds, `ran` seconds of running and
        `waited` seconds of waiting since its submission."""
        if self.promote_knob is not None and ran > 0 and waited >= self.promote_knob * ran:
            return 0
        return bisect_right(self.thresholds, attained)

    def pending_queue(self, g: GangRequest, clock: float) -> int:
        ran = g.attained_service / max(1, g.total.gpus)
        return self.queue_of(g.attained_service, ran, clock - g.submitted_at - ran)

    def running_queue(self, r: RunningWorkload, clock: float) -> int:
        """A running gang's queue: by all its attained service; 0 for the whole attempt
        when it was promoted as it started (so that it makes progress: a wide gang would
        otherwise climb out of queue 0 in minutes and be preempted before its first
        checkpoint, again and again)."""
        gpus = max(1, r.gang.total.gpus)
        before = r.gang.attained_service / gpus
        waited = r.started_at - r.gang.submitted_at - before
        if self.promote_knob is not None and before > 0 and waited >= self.promote_knob * before:
            return 0
        return bisect_right(
            self.thresholds, r.gang.attained_service + max(0.0, clock - r.started_at) * gpus
        )

    def plan(self, snapshot: Snapshot, clock: float) -> list[Decision]:
        c = Cycle(snapshot, clock, self.memo)
        rule = shared_rule(c)
        preemptor = RankedPreemptor(c, rule)
        ranked = sorted(
            (-g.priority, self.pending_queue(g, clock), g.submitted_at, g.workload_id, g)
            for g in snapshot.pending
        )
        # running gangs, the lowest-ranked (the first victims) first; sorted only when a
        # gang first tries to preempt (most cycles never do)
        running = once(lambda: self._ranked_running(snapshot.running, clock))
        failed: set[tuple] = set()
        held = False
        refused: dict[tuple, Refusal] = {}  # within a cycle, room only shrinks
        for _, level, _, _, g in ranked:
            refusal = try_admit(c, g, rule, refused)
            if refusal is None:
                continue
            never = c.never_fits(g)
            if never:
                c.never(g, never)
                continue
            if self.preemption:  # (a full pool without quotas refuses as "quota")
                n, pool = self._preempt(c, g, level, running, preemptor, failed)
                if n:
                    c.wait(
                        g,
                        f"preempting {n} workload(s) of lower LAS queues in pool {pool}",
                        WaitKind.PREEMPTING,
                    )
                    continue
            reason = refusal.reason
            if (
                (refusal.room or not snapshot.quotas)  # without quotas, a full pool
                and level == 0
                and not held
                and clock - g.submitted_at >= self.starve_after_s
            ):
                held = True
                for pool in c.pools_for(g):
                    nodes = c.index.soonest_nodes(g, pool)
                    if nodes:
                        c.index.hold(nodes)
                        reason += "; nodes are held for it"
                        break
            c.wait(g, reason, refusal.kind)
        return c.decisions()

    def _ranked_running(self, running: tuple, clock: float) -> tuple[list, list]:
        """The preemptible running gangs as (priority class, -queue, work lost, -submitted,
        id, gang), ascending (the first victims first; ids are unique, so the gangs are
        never compared), and their (priority class, -queue) prefixes in the same order.

        The same order as sorting by `running_queue` and `RunningWorkload.work_lost`, with
        what does not depend on the clock computed once per running gang
        (`kept_by_object`: the simulator hands the same objects again)."""
        thresholds = self.thresholds
        out = []
        for r, known in kept_by_object(self.memo, "las_running", running, self._constants):
            ok, prio, promoted, attained, gpus, started, lost_gpus, ckpt, every, neg, wid = known
            if not ok or started >= clock:  # see `RankedPreemptor`
                continue
            queue = (
                0
                if promoted
                else bisect_right(thresholds, attained + max(0.0, clock - started) * gpus)
            )
            if ckpt is not None:  # RunningWorkload.last_checkpoint, inline
                last = max(ckpt, started)
            elif every and every > 0 and clock > started:
                last = started + ((clock - started) // every) * every
            else:
                last = started
            out.append((prio, -queue, max(0.0, clock - last) * lost_gpus, neg, wid, r))
        out.sort()
        return out, [e[:2] for e in out]

    def _constants(self, r: RunningWorkload) -> tuple:
        """What `running_queue` and `work_lost` read that does not change with the clock."""
        g = r.gang
        gpus = max(1, g.total.gpus)
        before = g.attained_service / gpus
        waited = r.started_at - g.submitted_at - before
        knob = self.promote_knob
        promoted = knob is not None and before > 0 and waited >= knob * before
        return (
            g.preemptible,
            g.priority,
            promoted,
            g.attained_service,
            gpus,
            r.started_at,
            g.total.gpus,
            r.last_checkpoint_at,
            r.checkpoint_every_s,
            -g.submitted_at,
            r.workload_id,
        )

    def _preempt(self, c, g, level, running, preemptor, failed) -> tuple[int, str]:
        """Preempt gangs of lower queues for `g` in the first pool where that suffices."""
        rank = (g.priority, -level)
        for pool in c.pools_for(g):
            shape = preemption_shape(g, pool, rank)
            if pool not in c.index.pools or shape in failed:
                continue
            ranked, prefixes = running()
            # those of a strictly lower (class, queue): a prefix of the ranked list
            victims = [e[-1] for e in ranked[: bisect_left(prefixes, rank)]]
            n = preemptor.preempt(
                g,
                pool,
                victims,
                lambda v: f"preempted for {g.workload_id}: it is in a higher LAS queue",
            )
            if n:
                return n, pool
            failed.add(shape)
        return 0, ""
