"""Gang-shaped guarantees by defragmentation (core.policies.defrag, fair's use of it).

The minimal case: two 8-GPU nodes; team b runs 8 one-GPU jobs within its guarantee of 8,
four on each node (what is left after others ended), so 8 GPUs are free but no node is
whole; team a (guarantee 8) asks for one 8-GPU worker. Nobody borrows, so preemption
cannot help: before defragmentation a waited until b's jobs happened to end. Now b's
four cheapest jobs move to the other node and a starts on the node they leave.
"""

from __future__ import annotations

from dataclasses import replace

from aicluster.core.model import Admit, Preempt, Wait, WaitKind
from aicluster.core.policies.fair import FairPolicy, Moved
from aicluster.sim import SimConfig, TraceJob, simulate, team_cluster

from builders import by_id, gang, node
from sched_helpers import apply, q, qsnap, running

CLOCK = 10_000.0
EVERY = 1800.0  # b's jobs checkpoint every 30 min from their start


def _fragmented(started=(CLOCK - 100.0,) * 8, priority: int = 0, b_gpus: int = 1):
    """b's eight jobs, four per node; a's 8-GPU gang pending. `started`: each b job's
    start (its last checkpoint is at most EVERY old)."""
    nodes = [node("n0", gpus=8), node("n1", gpus=8)]
    runs = [
        running(
            gang(f"b{i}", team="b", gpus=b_gpus, priority=priority),
            ["n0" if i < 4 else "n1"],
            started_at=started[i],
            checkpoint_every_s=EVERY,
        )
        for i in range(8)
    ]
    pending = [gang("a1", team="a", gpus=8, submitted_at=CLOCK)]
    return qsnap(nodes, pending, runs, quotas=[q("a", 8), q("b", 8)])


def test_a_guaranteed_gang_fragmented_out_gets_its_node_by_moving_cheap_work():
    policy = FairPolicy()
    snap = _fragmented()
    first = policy.plan(snap, CLOCK)
    moved = [d for d in first if isinstance(d, Preempt)]
    assert [d.workload_id for d in moved] == ["b0", "b1", "b2", "b3"]  # one node cleared
    assert all(d.move for d in moved)
    assert all("starts again at once" in d.reason for d in moved)
    wait = by_id(first)["a1"]
    assert wait.kind is WaitKind.PREEMPTING and "moving 4 workload(s)" in wait.reason
    # the room each mover goes to is kept for it: the other node
    assert {w: r.placement for w, r in policy.reservations.items() if isinstance(r, Moved)} == {
        f"b{i}": ("n1",) for i in range(4)
    }
    # next cycle (the movers stopped and queued again): a starts on the cleared node,
    # every mover starts again at once on the other one
    second = by_id(policy.plan(apply(snap, first, CLOCK), CLOCK))
    assert second["a1"] == Admit("a1", ("n0",))
    assert {w: second[w] for w in ("b0", "b1", "b2", "b3")} == {
        f"b{i}": Admit(f"b{i}", ("n1",)) for i in range(4)
    }
    assert policy.reservations == {}


def test_without_defragmentation_the_gang_only_waits():
    decided = by_id(FairPolicy(defrag=False).plan(_fragmented(), CLOCK))
    assert isinstance(decided["a1"], Wait) and decided["a1"].kind is not WaitKind.PREEMPTING
    assert not any(isinstance(d, Preempt) for d in decided.values())


def test_work_whose_last_checkpoint_is_old_is_not_moved():
    """Moving must be cheap: b's jobs on n0 last checkpointed 20 min ago (more than the
    10 allowed), so the node whose jobs lose the least moves, or none when both are old."""
    old = CLOCK - 1200.0  # last checkpoint (from the start) 1,200 s ago
    new = CLOCK - 100.0
    first = FairPolicy().plan(_fragmented(started=(old,) * 4 + (new,) * 4), CLOCK)
    assert [d.workload_id for d in first if isinstance(d, Preempt)] == ["b4", "b5", "b6", "b7"]
    none = FairPolicy().plan(_fragmented(started=(old,) * 8), CLOCK)
    assert not any(isinstance(d, Preempt) for d in none)


def test_higher_priority_or_larger_work_is_never_moved():
    assert not any(
        isinstance(d, Preempt) for d in FairPolicy().plan(_fragmented(priority=5), CLOCK)
    )


def test_nothing_moves_when_the_movers_would_not_fit_elsewhere():
    """8 GPUs are free (4 on n0, 1 on each of n1-n4), but clearing n0 means moving b's
    two 2-GPU jobs, and no other node has 2 GPUs free (o's 7-GPU jobs there last
    checkpointed long ago: not movable). Nothing moves; a waits."""
    nodes = [node(f"n{i}", gpus=8) for i in range(5)]
    runs = [
        running(gang(f"b{i}", team="b", gpus=2), ["n0"], started_at=CLOCK - 60.0) for i in range(2)
    ] + [running(gang(f"o{i}", team="o", gpus=7), [f"n{i}"], started_at=0.0) for i in range(1, 5)]
    quotas = [q("a", 8), q("b", 4), q("o", 28)]
    policy = FairPolicy()
    decided = policy.plan(qsnap(nodes, [gang("a1", team="a", gpus=8)], runs, quotas), CLOCK)
    assert not any(isinstance(d, Preempt) for d in decided)
    assert by_id(decided)["a1"].kind is not WaitKind.PREEMPTING
    assert policy.reservations == {}


def test_a_mover_still_stopping_keeps_its_new_room_and_is_asked_again():
    """The live plane: the movers still show as running in the next snapshot. Nothing
    else takes their new room; they are asked to stop again, nobody new is chosen."""
    policy = FairPolicy()
    snap = _fragmented()
    first = policy.plan(snap, CLOCK)
    # a newcomer of team c (no quota: it borrows) that would fit n1's free GPUs
    late = replace(snap, pending=(*snap.pending, gang("c1", team="c", gpus=4)))
    again = by_id(policy.plan(late, CLOCK + 5))
    asked = sorted(w for w, d in again.items() if isinstance(d, Preempt))
    assert asked == ["b0", "b1", "b2", "b3"] and all(again[w].move for w in asked)
    assert again["a1"].kind is WaitKind.PREEMPTING
    assert isinstance(again["c1"], Wait)  # n1's free room is the movers'
    assert set(policy.reservations) == {"a1", "b0", "b1", "b2", "b3"}
    # once stopped, all start where they were meant to
    third = by_id(policy.plan(apply(snap, first, CLOCK + 10), CLOCK + 10))
    assert third["a1"] == Admit("a1", ("n0",))
    assert all(third[f"b{i}"] == Admit(f"b{i}", ("n1",)) for i in range(4))


def test_the_simulator_starts_the_gang_and_the_movers_at_once():
    """Replay of the minimal case: b's 16 one-GPU jobs fill both nodes (b borrows 8 from
    a), eight end at 1,000 s leaving four on each node, a's 8-GPU job arrives at
    1,100 s. With defragmentation it starts at once; without, it waits for b's jobs."""
    jobs = [
        TraceJob(f"b{i:02d}", "b", 0.0, 1000.0 if i % 2 else 20_000.0, 1) for i in range(16)
    ] + [TraceJob("a1", "a", 1100.0, 3600.0, 8)]
    cluster = team_cluster({"a": 1, "b": 1}, 1.0)  # a node each
    cfg = SimConfig(checkpoint_every_s=600.0, restore_s=60.0)
    moved = simulate(jobs, cluster, FairPolicy(), cfg)
    a1 = next(r for r in moved.jobs if r.job.job_id == "a1")
    assert a1.first_start == 1100.0
    assert sum(r.moves for r in moved.jobs) == 4
    movers = [r for r in moved.jobs if r.moves]
    # each mover loses its work since its last checkpoint (at 600 s) and pays a restore
    assert all(r.finish == 20_000.0 + (1100.0 - 600.0) + 60.0 for r in movers)
    plain = simulate(jobs, cluster, FairPolicy(defrag=False), cfg)
    assert next(r for r in plain.jobs if r.job.job_id == "a1").first_start >= 20_000.0


# -- fair-share reclaim (core.policies.preemption, share=True) -------------------------


def _share_case(c_borrows: bool):
    """Four 8-GPU nodes; a (guarantee 16) holds 8 and asks for 16 more (two nodes),
    which takes it beyond its guarantee. Either team c (no quota: every GPU it holds is
    borrowed) holds two nodes and b holds one, or b holds three (8 borrowed)."""
    nodes = [node(f"n{i}", gpus=8) for i in range(4)]
    runs = [running(gang("a0", team="a", gpus=8), ["n0"], started_at=0.0)]
    if c_borrows:
        runs += [running(gang("b0", team="b", gpus=8), ["n1"], started_at=0.0)]
        runs += [running(gang(f"c{i}", team="c", gpus=8), [f"n{i}"]) for i in (2, 3)]
    else:
        runs += [running(gang(f"b{i}", team="b", gpus=8), [f"n{i}"]) for i in (1, 2, 3)]
    pending = [gang("a1", team="a", workers=2, gpus=8, submitted_at=CLOCK)]
    return qsnap(nodes, pending, runs, quotas=[q("a", 16), q("b", 16)])


def test_a_team_below_its_guarantee_preempts_a_larger_share_for_a_gang_beyond_it():
    policy = FairPolicy()
    snap = _share_case(c_borrows=True)
    first = policy.plan(snap, CLOCK)
    assert sorted(d.workload_id for d in first if isinstance(d, Preempt)) == ["c2", "c3"]
    wait = by_id(first)["a1"]
    assert wait.kind is WaitKind.PREEMPTING and "fair share" in wait.reason
    second = by_id(policy.plan(apply(snap, first, CLOCK), CLOCK))
    assert second["a1"] == Admit("a1", ("n2", "n3"))


def test_fair_share_reclaim_never_leaves_the_preemptor_above_its_victim():
    """b borrows 8 (24 of 16: share 1.5); a with the gang would hold 24 of 16 (1.5) and
    b, once its job stopped, 16 of 16 (1.0): a would end above b, so nothing is
    preempted (and b could not take it back either way: no ping-pong)."""
    decided = FairPolicy().plan(_share_case(c_borrows=False), CLOCK)
    assert not any(isinstance(d, Preempt) for d in decided)
    assert by_id(decided)["a1"].kind is not WaitKind.PREEMPTING


def test_the_longer_a_gang_waits_the_older_the_checkpoints_it_may_move():
    """b's jobs last checkpointed 20 min ago: not cheap for a gang that just arrived,
    but movable for one that has waited 25 min (the bound grows with the wait, up to
    30 min: everything that checkpoints every 30 min is then movable)."""
    snap = _fragmented(started=(CLOCK - 1200.0,) * 8)
    waited = replace(snap, pending=(gang("a1", team="a", gpus=8, submitted_at=CLOCK - 1500.0),))
    assert not any(isinstance(d, Preempt) for d in FairPolicy().plan(snap, CLOCK))
    moved = [d for d in FairPolicy().plan(waited, CLOCK) if isinstance(d, Preempt)]
    assert len(moved) == 4 and all(d.move for d in moved)
    # work that never checkpoints and has run for hours is never cheap, however long
    # the gang waits
    old = _fragmented(started=(0.0,) * 8)
    runs = tuple(replace(r, checkpoint_every_s=None) for r in old.running)
    forever = replace(old, running=runs, pending=waited.pending)
    assert not any(isinstance(d, Preempt) for d in FairPolicy().plan(forever, CLOCK))
