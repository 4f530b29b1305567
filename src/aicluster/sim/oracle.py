"""`srtf-oracle`: shortest remaining time first with perfect knowledge (bench only).

No real scheduler knows how long a job will still run; this one is told, by the
simulator (`simulate` hands a policy with `with_oracle` the true remaining seconds of
every job, restore time included). It shows how far ordering with perfect knowledge
goes on mean JCT (SRTF minimises mean response time on a single server; with gangs and
preemption costs it is a reference point, not a proven bound).

Rules: one shared queue (quotas only as ceilings, as in `las`); pending gangs in order
of priority class, then remaining time, arrival, id; a gang that fits starts (work
conserving); one that does not preempts running gangs whose remaining time is strictly
longer (same or lower priority class, started before now), longest first, until it
fits, and starts once they have stopped. No starvation guard: long wide gangs wait
until the short ones are done (a finite trace always drains). Work lost to a
preemption (since the last checkpoint) is charged by the simulator as for every
policy, and then counts in the victim's remaining time.

Remaining time, not remaining GPU-seconds: a wide short gang goes before a narrow long
one. Give it the whole queue (`SimConfig.queue_depth`), as `bench/scheduler.py` does:
an arrival-ordered window hides the short gangs it would pick.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from aicluster.core.model import Decision, Snapshot, WaitKind
from aicluster.core.policies.base import Cycle, kept_by_object
from aicluster.core.policies.las import RankedPreemptor, once, shared_rule, try_admit
from aicluster.core.policies.preemption import preemption_shape

Remaining = Callable[[str, float], float]


@dataclass(frozen=True)
class SrtfOracle:
    name: str = "srtf-oracle"
    remaining: Remaining | None = None  # set by the simulator (see `with_oracle`)
    preemption: bool = True
    memo: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    def with_oracle(self, remaining: Remaining) -> SrtfOracle:
        return replace(self, remaining=remaining, memo={})

    def plan(self, snapshot: Snapshot, clock: float) -> list[Decision]:
        if self.remaining is None:
            raise RuntimeError("srtf-oracle runs only in the simulator, which knows run times")
        left = self.remaining
        c = Cycle(snapshot, clock, self.memo)
        rule = shared_rule(c)
        preemptor = RankedPreemptor(c, rule)
        pending = sorted(
            ((-g.priority, left(g.workload_id, clock), g.submitted_at, g.workload_id), g)
            for g in snapshot.pending
        )
        # running gangs, longest remaining (the first victims) first; sorted only when a
        # gang first tries to preempt
        running = once(lambda: _by_class(self._ranked_running(snapshot.running, clock)))
        failed: dict[tuple, float] = {}  # shape -> shortest remaining that found no victims
        refused: dict = {}
        for (_, mine, _, _), g in pending:
            refusal = try_admit(c, g, rule, refused)
            if refusal is None:
                continue
            never = c.never_fits(g)
            if never:
                c.never(g, never)
                continue
            if self.preemption:  # (a full pool without quotas refuses as "quota")
                for pool in c.pools_for(g):
                    shape = preemption_shape(g, pool, g.priority)
                    if pool not in c.index.pools or mine >= failed.get(shape, float("inf")):
                        continue
                    victims = [  # same or lower class, more time left: a prefix of each
                        r
                        for prio, negs, gangs in running()
                        if prio <= g.priority
                        for r in gangs[: bisect_left(negs, -mine)]
                    ]
                    n = preemptor.preempt(
                        g,
                        pool,
                        victims,
                        lambda v, g=g: (
                            f"preempted for {g.workload_id}: it has less time left to run"
                        ),
                    )
                    if n:
                        c.wait(
                            g,
                            f"preempting {n} workload(s) with more time left in pool {pool}",
                            WaitKind.PREEMPTING,
                        )
                        break
                    failed[shape] = mine
                else:
                    c.wait(g, refusal.reason, refusal.kind)
                continue
            c.wait(g, refusal.reason, refusal.kind)
        return c.decisions()

    def _ranked_running(self, running: tuple, clock: float) -> list:
        """((class, -left, -submitted), id, gang) of the preemptible running gangs,
        ascending (the longest left first within a class).

        A running gang's time left falls one second per second: the oracle is asked once
        per attempt, at its start (`kept_by_object`: the same object comes again),
        and `left` now is max(0, at start - (clock - started)): the oracle's own sum, in
        the same order, so the same float."""
        left, out = self.remaining, []

        def known(r):
            g = r.gang
            key = (g.preemptible, g.priority, -g.submitted_at, r.workload_id)
            return left(r.workload_id, r.started_at), key

        for r, (at_start, (ok, prio, neg_sub, wid)) in kept_by_object(
            self.memo, "srtf_running", running, known
        ):
            if not ok or r.started_at >= clock:  # see `RankedPreemptor`
                continue
            out.append(((prio, -max(0.0, at_start - (clock - r.started_at)), neg_sub), wid, r))
        out.sort()
        return out


def _by_class(ranked: list) -> list[tuple[int, list[float], list]]:
    """The ranked running gangs ((class, -left, -submitted), id, gang), ascending, as
    (class, their -left, their gangs) per priority class in the same order: within a
    class the gangs with more than t seconds left are the prefix before -t."""
    prios = [e[0][0] for e in ranked]
    negs = [e[0][1] for e in ranked]
    gangs = [e[2] for e in ranked]
    out: list[tuple[int, list[float], list]] = []
    start = 0
    while start < len(ranked):
        end = bisect_right(prios, prios[start], start)
        out.append((prios[start], negs[start:end], gangs[start:end]))
        start = end
    return out
