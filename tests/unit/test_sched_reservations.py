"""`fair` keeps the room it preempted for a guaranteed gang for that gang (its
reservations, kept across cycles), so a starving borrower tried first in the next cycle
cannot take it and be preempted again, for ever; and the simulator's handling of
preemption: each gang preempted for starts at once, stale finish events wake nobody.

The loop this prevents, in its smallest form: team a borrows the whole of team b's
guarantee with gangs that have waited long enough to be tried first; b's gang preempts
one of them; without a reservation the next cycle hands the freed node back to a's
starving gang, which b preempts again (400 synthetic jobs on 4 nodes took 208,270
preemptions and minutes of replay before the fix).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from aicluster.core.model import Admit, Preempt, Wait, WaitKind
from aicluster.core.policies.fair import FairPolicy
from aicluster.sim import SimConfig, TraceJob, simulate, synthetic, team_cluster

from builders import by_id, gang, node
from sched_helpers import apply, q, qsnap, running

H = 3600.0
CLOCK = 7 * H  # a's gangs, submitted at 0, have waited past starve_after_s (6 h)


def _borrowed_cluster():
    """Team a runs on both nodes (8 GPUs of its own, 8 borrowed from b) and has two more
    starving gangs queued; b's first gang arrives."""
    nodes = [node("n0", gpus=8), node("n1", gpus=8)]
    a1 = gang("a1", team="a", gpus=8)
    a2 = gang("a2", team="a", gpus=8)
    runs = [running(a1, ["n0"], started_at=0.0), running(a2, ["n1"], started_at=60.0)]
    pending = [gang("a3", team="a", gpus=8), gang("b1", team="b", gpus=8, submitted_at=CLOCK)]
    return qsnap(nodes, pending, runs, quotas=[q("a", 8), q("b", 8)])


def _preempting_cycle(policy: FairPolicy):
    snap = _borrowed_cluster()
    first = policy.plan(snap, CLOCK)
    d = by_id(first)
    assert [p.workload_id for p in first if isinstance(p, Preempt)] == ["a2"]
    assert d["b1"].kind is WaitKind.PREEMPTING
    assert set(policy.reservations) == {"b1"}
    return snap, first


def test_room_preempted_for_a_gang_goes_to_it_not_to_a_starving_borrower():
    policy = FairPolicy()
    snap, first = _preempting_cycle(policy)
    after = apply(snap, first, CLOCK)  # a2 stopped: queued again, starving, ahead of b1
    second = by_id(policy.plan(after, CLOCK))
    assert second["b1"] == Admit("b1", ("n1",))
    assert isinstance(second["a2"], Wait) and isinstance(second["a3"], Wait)
    assert not [d for d in second.values() if isinstance(d, Preempt)]
    assert policy.reservations == {}  # released once its gang is admitted
    # without the reservation, the starving borrower is tried first and takes the node
    # (and b1 would preempt it again in the cycle after)
    forgetful = by_id(FairPolicy().plan(after, CLOCK))
    assert isinstance(forgetful["a2"], Admit) or isinstance(forgetful["a3"], Admit)
    assert forgetful["b1"].kind is WaitKind.PREEMPTING


def test_while_victims_stop_the_room_is_kept_and_nobody_new_is_preempted():
    """The live plane: the victim may still show as running in the next snapshot."""
    policy = FairPolicy()
    snap, _ = _preempting_cycle(policy)
    again = by_id(policy.plan(snap, CLOCK + 5))  # a2 still running, stopping
    # only the same victim, asked again (a stop the control plane missed); nobody new
    assert [d.workload_id for d in again.values() if isinstance(d, Preempt)] == ["a2"]
    assert again["b1"].kind is WaitKind.PREEMPTING
    assert "room is kept for it" in again["b1"].reason
    assert set(policy.reservations) == {"b1"}
    # the victim stopped: its room goes to b1
    stopped = replace(
        snap,
        nodes=tuple(
            replace(n, allocated=n.allocated - n.allocated) if n.node_id == "n1" else n
            for n in snap.nodes
        ),
        running=tuple(r for r in snap.running if r.workload_id != "a2"),
    )
    assert by_id(policy.plan(stopped, CLOCK + 10))["b1"] == Admit("b1", ("n1",))
    assert policy.reservations == {}


def test_reservation_ends_when_its_gang_leaves_the_queue():
    policy = FairPolicy()
    snap, first = _preempting_cycle(policy)
    after = apply(snap, first, CLOCK)
    cancelled = replace(after, pending=tuple(g for g in after.pending if g.workload_id != "b1"))
    decided = by_id(policy.plan(cancelled, CLOCK))
    assert policy.reservations == {}
    assert any(isinstance(d, Admit) for d in decided.values())  # the node is not kept idle


def test_reservation_ends_when_it_can_no_longer_help():
    """Every victim stopped, yet the gang does not fit (its node was cordoned): the room
    is not kept; the gang is planned as any other (here it waits: nobody borrows now)."""
    policy = FairPolicy()
    snap, first = _preempting_cycle(policy)
    after = apply(snap, first, CLOCK)
    shrunk = replace(
        after,
        nodes=tuple(replace(n, schedulable=False) if n.node_id == "n1" else n for n in after.nodes),
    )
    decided = by_id(policy.plan(shrunk, CLOCK))
    assert decided["b1"].kind is WaitKind.CAPACITY
    assert not [d for d in decided.values() if isinstance(d, Preempt)]
    assert policy.reservations == {}


@dataclass(frozen=True)
class Recording:
    """`inner`, recording every cycle's clock and decisions (the simulator's view)."""

    inner: object
    cycles: list = field(default_factory=list, compare=False)

    @property
    def name(self) -> str:
        return self.inner.name

    def plan(self, snapshot, clock):
        decisions = self.inner.plan(snapshot, clock)
        self.cycles.append((clock, decisions))
        return decisions


def test_sim_fair_preempts_a_bounded_number_of_times_and_finishes_every_job():
    """The minimal case of the loop: 400 synthetic jobs, 4 nodes, queue depth 8."""
    jobs = synthetic(400, {"a": 1.0, "b": 2.0, "c": 1.0}, seed=3, mean_interarrival=20.0)
    cluster = team_cluster({"a": 1, "b": 2, "c": 1})
    policy = Recording(FairPolicy())
    result = simulate(jobs, cluster, policy, SimConfig(runtime_limit_factor=2.0, queue_depth=8))
    assert result.unfinished == 0 and result.loops == 0
    assert all(r.finish is not None for r in result.jobs)
    preemptions = sum(r.preemptions for r in result.jobs)
    assert 0 < preemptions <= len(jobs)  # 85 with the reservations
    # each gang that preempted starts at that same instant, in a later cycle
    promised: dict[str, float] = {}
    for clock, decisions in policy.cycles:
        for d in decisions:
            if isinstance(d, Admit):
                assert promised.pop(d.workload_id, clock) == clock
            elif isinstance(d, Wait) and d.kind is WaitKind.PREEMPTING:
                promised.setdefault(d.workload_id, clock)
    assert promised == {}


def test_sim_finish_events_of_preempted_attempts_trigger_no_cycle():
    """a1 borrows b's node; b1 preempts it at t=100; a1's first attempt would have ended
    at t=5000, while a2 waits: no cycle runs then (nothing happened)."""
    jobs = [
        TraceJob("a1", "a", 0.0, 5000.0, 16),
        TraceJob("b1", "b", 100.0, 1000.0, 8),
        TraceJob("a2", "a", 2000.0, 100.0, 16),
    ]
    policy = Recording(FairPolicy())
    cfg = SimConfig(checkpoint_every_s=None, restore_s=0.0)
    result = simulate(jobs, team_cluster({"a": 1, "b": 1}), policy, cfg)
    done = {r.job.job_id: (r.first_start, r.finish, r.preemptions) for r in result.jobs}
    assert done == {
        "a1": (0.0, 6100.0, 1),  # restarted from scratch at 1100, when b1 finished
        "b1": (100.0, 1100.0, 0),
        "a2": (6100.0, 6200.0, 0),
    }
    clocks = sorted({clock for clock, _ in policy.cycles})
    assert clocks == [0.0, 100.0, 1100.0, 2000.0, 6100.0]
    assert result.cycles == len(policy.cycles)


def test_gangs_preempted_for_in_one_cycle_each_start_where_they_were_planned():
    """Found by the property test once fair reclaimed by fair share: new0 counted on
    old1's room on n0 and a free GPU on n3, new2 on the room of old5 and old6 on n3.
    Admitted best fit in the next cycle, new0 took both of its GPUs on n3 and new2 had to
    preempt again; each reserved gang now starts on the placement it was planned on."""
    nodes = [node(f"n{i}", gpus=g) for i, g in enumerate((2, 2, 2, 8))]
    nodes.append(node("n4", gpus=2, pool="p2"))
    runs = [
        running(gang("old0", team="a", gpus=1), ["n0"]),
        running(gang("old7", team="a", gpus=2), ["n1"]),
        running(gang("old1", team="b", gpus=1), ["n0"]),
        running(gang("old2", team="b", gpus=1), ["n2"]),
        running(gang("old3", team="b", gpus=1), ["n2"]),
        running(gang("old4", team="b", gpus=1), ["n3"]),
        *(running(gang(f"old{i}", team="b", gpus=2), ["n3"]) for i in (5, 6, 8)),
    ]
    pending = [
        gang("new0", team="a", workers=2, gpus=1, submitted_at=100.0),
        gang("new1", team="a", gpus=1, submitted_at=101.0),
        gang("new2", team="a", gpus=4, submitted_at=102.0),
    ]
    snap = qsnap(nodes, pending, runs, quotas=[q("a", 7)])
    policy = FairPolicy()
    first = policy.plan(snap, 120.0)
    preempting = {d.workload_id for d in first if isinstance(d, Wait) and d.kind == "preempting"}
    assert preempting == {"new0", "new1", "new2"}
    second = by_id(policy.plan(apply(snap, first, 120.0), 121.0))
    assert all(isinstance(second[w], Admit) for w in preempting), second
    assert not [d for d in second.values() if isinstance(d, Preempt)]
