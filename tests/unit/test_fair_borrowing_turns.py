"""`fair`'s borrowing pass says a Wait straight away for a gang refused as the last gang
of its team and shape was, nothing having changed since (core.policies.fair
`_borrowing`). Checked against the pass that asks `_borrow` for every gang, over random
queues where many gangs share a few shapes: the same decisions, in the same order, word
for word."""

from __future__ import annotations

from dataclasses import dataclass, replace
from heapq import heappop, heappush

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aicluster.core.model import Snapshot, Wait
from aicluster.core.policies.fair import FairPolicy
from aicluster.core.scheduler import plan_cycle

from builders import gang, node
from sched_helpers import apply, q

TEAMS = ["a", "b", "c"]


@dataclass(frozen=True)
class EveryTurnAsked(FairPolicy):
    """The reference: every turn of the borrowing pass asks `_borrow`."""

    def _borrowing(self, c, deferred, closed, reclaimer=None) -> None:
        heap = [(c.book.share(t), q[0][0], t) for t, q in deferred.items()]
        heap.sort()
        nxt = dict.fromkeys(deferred, 0)
        while heap:
            _, _, team = heappop(heap)
            key, g = deferred[team][nxt[team]]
            nxt[team] += 1
            self._borrow(c, g, closed, reclaimer)
            if nxt[team] < len(deferred[team]):
                heappush(heap, (c.book.share(team), deferred[team][nxt[team]][0], team))


@st.composite
def queues(draw):
    """A cluster part-filled by `fair`, then a long queue of gangs of a few shapes."""
    nodes = [
        replace(node(f"n{i}", gpus=8, cpus=64), rack=f"r{i % 2}")
        for i in range(draw(st.integers(1, 6)))
    ]
    total = 8 * len(nodes)
    quotas, left = [], total
    for t in TEAMS[: draw(st.integers(1, 3))]:
        g = draw(st.integers(0, left // 2))
        left -= g
        quotas.append(q(t, g, borrow_gpus=draw(st.sampled_from([None, 0, 4, 16]))))

    def gangs(prefix: str, k: int, t0: float):
        return [
            gang(
                f"{prefix}{j}",
                team=draw(st.sampled_from(TEAMS)),
                workers=draw(st.sampled_from([1, 1, 2])),
                gpus=draw(st.sampled_from([1, 4, 8])),
                submitted_at=t0 + j,
                priority=draw(st.sampled_from([0, 0, 1])),
            )
            for j in range(k)
        ]

    start = Snapshot(
        tuple(nodes), tuple(gangs("old", draw(st.integers(0, 12)), 0.0)), (), tuple(quotas)
    )
    state = apply(start, plan_cycle(start, 0.0, "fair"), 0.0)
    return replace(state, pending=tuple(gangs("new", draw(st.integers(5, 60)), 100.0)))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=queues(), preemption=st.booleans())
def test_the_borrowing_pass_decides_as_one_that_asks_every_turn(snap, preemption):
    fast = FairPolicy(preemption=preemption).plan(snap, 200.0)
    slow = EveryTurnAsked(preemption=preemption).plan(snap, 200.0)
    assert fast == slow


def test_a_long_queue_of_one_shape_is_refused_once_and_said_for_the_rest():
    """40 one-node gangs of team b behind a full cluster: every one waits with the same
    sentence, in queue order, as asking each would say."""
    nodes = (node("n0", gpus=8, cpus=64),)
    full = Snapshot(
        nodes,
        (gang("big", team="a", workers=1, gpus=8),),
        (),
        (q("a", 8), q("b", 0, borrow_gpus=8)),
    )
    state = apply(full, plan_cycle(full, 0.0, "fair"), 0.0)
    queue = tuple(
        gang(f"w{j:02d}", team="b", workers=1, gpus=8, submitted_at=10.0 + j) for j in range(40)
    )
    state = replace(state, pending=queue)
    fast = FairPolicy().plan(state, 20.0)
    assert fast == EveryTurnAsked().plan(state, 20.0)
    assert [d.workload_id for d in fast] == [g.workload_id for g in queue]
    assert all(isinstance(d, Wait) for d in fast)
    assert len({(d.reason, d.kind) for d in fast}) == 1, fast[:2]


def test_a_gang_refused_after_room_changed_gets_the_sentence_of_now():
    """b0 is refused, a0 then takes 2 of the free GPUs, and b1 (b0's shape) is refused
    again: its sentence counts what is free after a0, not what was free for b0."""
    nodes = (node("n0", gpus=8, cpus=64),)
    quotas = (q("a", 0, borrow_gpus=8), q("b", 0, borrow_gpus=8), q("c", 2))
    start = Snapshot(nodes, (gang("c0", team="c", workers=1, gpus=2),), (), quotas)
    state = apply(start, plan_cycle(start, 0.0, "fair"), 0.0)
    pending = (
        gang("b0", team="b", workers=1, gpus=8, submitted_at=10.0),
        gang("a0", team="a", workers=1, gpus=2, submitted_at=11.0),
        gang("b1", team="b", workers=1, gpus=8, submitted_at=12.0),
    )
    decisions = FairPolicy().plan(replace(state, pending=pending), 20.0)
    assert decisions == EveryTurnAsked().plan(replace(state, pending=pending), 20.0)
    by_id = {d.workload_id: d for d in decisions}
    assert not isinstance(by_id["a0"], Wait)
    assert by_id["b0"].reason != by_id["b1"].reason, (by_id["b0"].reason, by_id["b1"].reason)
