"""Queue order, capacity and never-fits through core.scheduler.plan_cycle, for every
policy where the rule is shared, and head-of-line blocking under `fifo`.

Clusters here have no quotas (one shared partition per pool) and nodes whose
`allocated` stands for work the scheduler does not own, so each case is about order,
capacity and placement alone. Quotas, borrowing, backfill and preemption are in
test_sched_policies.py; topology preferences in test_sched_placement.py.
"""

from __future__ import annotations

import copy
import math
import random

import pytest

from aicluster.core.model import Admit, Res, Wait, WaitKind
from aicluster.core.policies.base import arrival_key
from aicluster.core.scheduler import POLICY_NAMES, plan_cycle

from builders import GiB, admits, by_id, gang, node, snapshot, usage_per_node, waits

ALL = pytest.mark.parametrize("policy", POLICY_NAMES)
FCFS = pytest.mark.parametrize("policy", ["fifo", "backfill"])


def plan(snap, policy, clock=0.0):
    return plan_cycle(snap, clock, policy)


# -- order ----------------------------------------------------------------------------


@FCFS
def test_decides_in_priority_then_arrival_order(policy):
    snap = snapshot(
        [node("n1", gpus=8)],
        [
            gang("late-low", gpus=1, priority=0, submitted_at=3.0),
            gang("early-low", gpus=1, priority=0, submitted_at=1.0),
            gang("high", gpus=1, priority=5, submitted_at=9.0),
            gang("mid", gpus=1, priority=2, submitted_at=5.0),
        ],
    )
    decisions = plan(snap, policy)
    assert [d.workload_id for d in decisions] == ["high", "mid", "early-low", "late-low"]
    assert all(isinstance(d, Admit) for d in decisions)


@ALL
def test_scarce_capacity_goes_to_higher_priority_even_if_it_arrived_later(policy):
    snap = snapshot(
        [node("n1", gpus=1)],
        [
            gang("old", gpus=1, priority=0, submitted_at=0.0),
            gang("urgent", gpus=1, priority=10, submitted_at=100.0),
        ],
    )
    d = by_id(plan(snap, policy, clock=100.0))
    assert d["urgent"] == Admit("urgent", ("n1",))
    assert isinstance(d["old"], Wait) and d["old"].never_fits is False


@ALL
def test_scarce_capacity_goes_to_the_earlier_arrival_at_equal_priority(policy):
    snap = snapshot(
        [node("n1", gpus=1)],
        [gang("second", gpus=1, submitted_at=2.0), gang("first", gpus=1, submitted_at=1.0)],
    )
    d = by_id(plan(snap, policy))
    assert d["first"] == Admit("first", ("n1",))
    assert isinstance(d["second"], Wait) and d["second"].never_fits is False


@ALL
def test_arrival_ties_break_by_workload_id(policy):
    one_gpu = snapshot(
        [node("n1", gpus=1)],
        [gang("b", gpus=1, submitted_at=1.0), gang("a", gpus=1, submitted_at=1.0)],
    )
    assert admits(plan(one_gpu, policy)) == {"a": ("n1",)}
    roomy = snapshot([node("n1", gpus=8)], one_gpu.pending)
    if policy != "fair":  # fair decides in two passes; its order is tested elsewhere
        assert [d.workload_id for d in plan(roomy, policy)] == ["a", "b"]


@ALL
def test_empty_queue_gives_no_decisions(policy):
    assert plan(snapshot([node("n1", gpus=8)], []), policy) == []


@ALL
@pytest.mark.parametrize(
    "nodes", [[], [node("a", gpus=8, schedulable=False)]], ids=["no-nodes", "all-cordoned"]
)
def test_without_schedulable_nodes_every_gang_could_never_fit(policy, nodes):
    (d,) = plan(snapshot(nodes, [gang("g", gpus=1)]), policy)
    assert isinstance(d, Wait) and d.never_fits is True
    assert d.kind is WaitKind.NEVER_FITS
    assert d.reason.startswith("could never fit")


# -- gangs: all workers or none ----------------------------------------------------------


@ALL
def test_gang_waits_when_only_part_of_it_fits(policy):
    # Room for one worker on each of two nodes; a 3-worker gang must not be split.
    snap = snapshot(
        [node("a", gpus=2, used_gpus=1), node("b", gpus=2, used_gpus=1)],
        [gang("g3", workers=3, gpus=1)],
    )
    (d,) = plan(snap, policy)
    assert isinstance(d, Wait) and d.workload_id == "g3"
    assert d.never_fits is False  # the empty cluster (4 GPUs) would hold it
    assert d.kind is WaitKind.CAPACITY
    assert d.reason.startswith("waiting for capacity") and "needs 3 x" in d.reason


@ALL
def test_gang_admitted_when_it_fits_exactly_across_nodes(policy):
    snap = snapshot(
        [node("a", gpus=2, used_gpus=1), node("b", gpus=2, used_gpus=1), node("c", gpus=1)],
        [gang("g3", workers=3, gpus=1)],
    )
    (d,) = plan(snap, policy)
    assert isinstance(d, Admit) and sorted(d.placement) == ["a", "b", "c"]


# -- capacity -----------------------------------------------------------------------------


@ALL
def test_what_is_left_beside_allocations_is_admitted(policy):
    snap = snapshot([node("a", gpus=4, used_gpus=3)], [gang("one", gpus=1)])
    assert plan(snap, policy) == [Admit("one", ("a",))]


@ALL
def test_capacity_is_consumed_within_one_cycle(policy):
    snap = snapshot(
        [node("a", gpus=4)],
        [gang(f"g{i}", gpus=1, submitted_at=float(i)) for i in range(6)],
    )
    decisions = plan(snap, policy)
    assert list(admits(decisions)) == ["g0", "g1", "g2", "g3"]
    w = waits(decisions)
    assert sorted(w) == ["g4", "g5"]
    assert not w["g4"].never_fits and "needs 1" in w["g4"].reason
    if policy == "fifo":
        assert w["g5"] == Wait("g5", "queued behind g4", WaitKind.QUEUED_BEHIND)


# (node, a gang that waits for it, a gang bigger than the node ever is)
DIMENSIONS = {
    "cpus": (dict(cpus=4, used_cpus=3), dict(cpus=2), dict(cpus=8)),
    "memory": (
        dict(memory=8 * GiB, used_memory=7 * GiB),
        dict(cpus=0, memory=2 * GiB),
        dict(cpus=0, memory=16 * GiB),
    ),
    "gpus": (dict(gpus=8, used_gpus=8), dict(gpus=1), dict(gpus=9)),
}


@ALL
@pytest.mark.parametrize("dim", sorted(DIMENSIONS))
def test_every_resource_dimension_limits_admission(policy, dim):
    node_kw, waits_kw, never_kw = DIMENSIONS[dim]
    (d,) = plan(snapshot([node("a", **node_kw)], [gang("g", **waits_kw)]), policy)
    assert isinstance(d, Wait) and d.never_fits is False
    # judged on capacity: the same node, empty, would hold the first gang but never the second
    empty = {k: v for k, v in node_kw.items() if not k.startswith("used_")}
    assert plan(snapshot([node("a", **empty)], [gang("g", **waits_kw)]), policy) == [
        Admit("g", ("a",))
    ]
    (d,) = plan(snapshot([node("a", **node_kw)], [gang("g", **never_kw)]), policy)
    assert isinstance(d, Wait) and d.never_fits is True
    assert d.reason.startswith("could never fit")


@ALL
def test_fractional_cpus_fill_a_node_exactly(policy):
    snap = snapshot(
        [node("a", cpus=1.0)],
        [gang(f"g{i}", cpus=0.1, submitted_at=float(i)) for i in range(11)],
    )
    decisions = plan(snap, policy)
    assert sorted(admits(decisions)) == sorted(f"g{i}" for i in range(10))
    assert isinstance(by_id(decisions)["g10"], Wait)
    assert not by_id(decisions)["g10"].never_fits


@ALL
def test_unschedulable_nodes_are_not_used(policy):
    snap = snapshot(
        [node("a", gpus=8, schedulable=False), node("b", gpus=2)],
        [gang("g", workers=2, gpus=1)],
    )
    assert plan(snap, policy) == [Admit("g", ("b", "b"))]


@ALL
def test_could_never_fit_counts_only_schedulable_nodes(policy):
    # 10 GPUs in all, but the 8-GPU node is cordoned: a 4-GPU gang could never fit,
    # and the reason describes the 2 schedulable GPUs.
    nodes = [node("big", gpus=8, schedulable=False), node("small", gpus=2)]
    for g in (gang("g", gpus=4), gang("g", workers=4, gpus=1)):
        (d,) = plan(snapshot(nodes, [g]), policy)
        assert isinstance(d, Wait) and d.never_fits is True
        assert d.reason.startswith("could never fit")
        assert d.reason.endswith("the largest pool has 2 GPUs on 1 matching node(s)")


@ALL
def test_never_fits_is_judged_on_capacity_not_on_current_allocations(policy):
    snap = snapshot([node("a", gpus=8, used_gpus=8)], [gang("g", workers=2, gpus=4)])
    (d,) = plan(snap, policy)
    assert isinstance(d, Wait) and d.never_fits is False


@ALL
def test_node_name_not_node_id_breaks_ties(policy):
    snap = snapshot(
        [node("id-1", name="zeta", gpus=4), node("id-2", name="alpha", gpus=4)],
        [gang("g", workers=2, gpus=1)],
    )
    assert plan(snap, policy) == [Admit("g", ("id-2", "id-2"))]


# -- head-of-line blocking and gangs that could never fit ---------------------------------


def test_fifo_head_of_line_blocks_later_small_gangs_but_fair_does_not():
    # 4 GPUs free, 2 on each node: the 4-GPU single worker waits; the small ones
    # would fit, but under fifo nothing overtakes the head.
    snap = snapshot(
        [node("a", gpus=4, used_gpus=2), node("b", gpus=4, used_gpus=2)],
        [
            gang("big", gpus=4, submitted_at=0.0),
            gang("small1", gpus=1, submitted_at=1.0),
            gang("small2", gpus=1, submitted_at=2.0),
        ],
    )
    decisions = plan(snap, "fifo")
    assert admits(decisions) == {}
    w = waits(decisions)
    assert w["big"].never_fits is False and w["big"].reason.startswith("waiting for capacity")
    assert w["small1"] == Wait("small1", "queued behind big", WaitKind.QUEUED_BEHIND)
    assert w["small2"] == Wait("small2", "queued behind big", WaitKind.QUEUED_BEHIND)
    # fair is work conserving: the gang that does not fit is skipped
    assert sorted(admits(plan(snap, "fair"))) == ["small1", "small2"]


def test_fifo_gangs_ahead_of_the_blocker_are_still_admitted():
    snap = snapshot(
        [node("a", gpus=4, used_gpus=1)],
        [
            gang("first", gpus=1, submitted_at=0.0),
            gang("big", gpus=4, submitted_at=1.0),
            gang("small", gpus=1, submitted_at=2.0),
        ],
    )
    decisions = plan(snap, "fifo")
    assert admits(decisions) == {"first": ("a",)}
    assert not waits(decisions)["big"].never_fits
    assert waits(decisions)["small"] == Wait("small", "queued behind big", WaitKind.QUEUED_BEHIND)


NEVER = {
    "bigger-than-any-node": gang("huge", gpus=16, submitted_at=0.0),
    "bigger-than-the-cluster": gang("huge", workers=3, gpus=8, submitted_at=0.0),
    "missing-gpu-model": gang("huge", gpus=1, gpu_model="V100", submitted_at=0.0),
}


@ALL
@pytest.mark.parametrize("kind", sorted(NEVER))
def test_a_gang_that_could_never_fit_does_not_block_later_gangs(policy, kind):
    snap = snapshot(
        [node("a", gpus=8, gpu_model="A100"), node("b", gpus=8, gpu_model="A100")],
        [NEVER[kind], gang("small", gpus=1, submitted_at=1.0)],
    )
    d = by_id(plan(snap, policy))
    assert isinstance(d["huge"], Wait) and d["huge"].never_fits is True
    assert d["huge"].reason.startswith("could never fit")
    if kind == "missing-gpu-model":
        assert "GPU model V100" in d["huge"].reason
    assert d["small"] == Admit("small", ("a",))


def test_a_never_fitting_gang_behind_a_blocker():
    # fifo checks the partition's blocker first: the gang is "queued behind" and only
    # found never-fitting once it heads the queue; backfill and fair say so at once.
    nodes = [node("a", gpus=4, used_gpus=4)]
    snap = snapshot(
        nodes, [gang("blocker", gpus=1, submitted_at=0.0), gang("huge", gpus=64, submitted_at=1.0)]
    )
    d = by_id(plan(snap, "fifo"))
    assert d["blocker"].never_fits is False
    assert d["huge"] == Wait("huge", "queued behind blocker", WaitKind.QUEUED_BEHIND)
    for policy in ("backfill", "fair"):
        d = by_id(plan(snap, policy))
        assert d["blocker"].never_fits is False
        assert d["huge"].never_fits is True and d["huge"].reason.startswith("could never fit")
    (alone,) = plan(snapshot(nodes, [snap.pending[1]]), "fifo")
    assert alone.never_fits is True


# -- GPU model ------------------------------------------------------------------------------


@ALL
@pytest.mark.parametrize(
    "asked, on_node", [("H100", "H100"), ("h100", "H100"), ("H100", "h100"), ("h100", "h100")]
)
def test_gpu_model_constraint_is_case_insensitive(policy, asked, on_node):
    snap = snapshot(
        [node("a", gpus=8, gpu_model="A100"), node("b", gpus=8, gpu_model=on_node)],
        [gang("g", workers=2, gpus=1, gpu_model=asked)],
    )
    assert plan(snap, policy) == [Admit("g", ("b", "b"))]


@ALL
def test_gpu_model_constraint_waits_rather_than_using_another_model(policy):
    snap = snapshot(
        [node("a", gpus=8, gpu_model="A100"), node("b", gpus=8, used_gpus=8, gpu_model="H100")],
        [gang("g", gpus=1, gpu_model="H100")],
    )
    (d,) = plan(snap, policy)
    assert isinstance(d, Wait) and d.never_fits is False


# -- determinism ------------------------------------------------------------------------------


def _mixed_snapshot():
    return snapshot(
        [
            node("n3", gpus=8, gpu_model="H100", used_gpus=3),
            node("n1", gpus=4, gpu_model="A100"),
            node("n2", gpus=4, gpu_model="A100", used_gpus=1),
            node("n4", gpus=8, schedulable=False),
        ],
        [
            gang("a", workers=2, gpus=2, gpu_model="a100", submitted_at=1),
            gang("b", workers=3, gpus=1, priority=3, submitted_at=5),
            gang("c", workers=1, gpus=32, submitted_at=2),
            gang("d", workers=4, gpus=1, submitted_at=3),
            gang("e", workers=1, gpus=1, submitted_at=4),
        ],
    )


@ALL
def test_same_snapshot_same_decisions_in_any_order_and_the_snapshot_is_unchanged(policy):
    snap = _mixed_snapshot()
    before = copy.deepcopy(snap)
    first = plan(snap, policy)
    assert {d.workload_id for d in first} == {"a", "b", "c", "d", "e"}
    assert admits(first) and waits(first)  # not a trivial case
    for _ in range(3):
        assert plan(snap, policy) == first
    assert plan(_mixed_snapshot(), policy) == first
    rng = random.Random(7)
    for _ in range(20):
        nodes, pending = list(snap.nodes), list(snap.pending)
        rng.shuffle(nodes)
        rng.shuffle(pending)
        assert plan(snapshot(nodes, pending), policy) == first
    assert snap == before


# -- randomized properties ----------------------------------------------------------------------
#
# An independent model of capacity: how many workers fit on a node, and the fewest nodes
# that hold a gang (the pool is one, nodes are their own racks, locality is "pool").


def _copies(need: Res, have: Res) -> int:
    counts = [
        math.floor(h / n)
        for n, h in ((need.cpus, have.cpus), (need.memory, have.memory), (need.gpus, have.gpus))
        if n > 0
    ]
    return min(counts) if counts else 10**9


def _fewest_nodes(g, nodes, free: dict[str, Res]) -> int | None:
    rooms = []
    for n in nodes:
        if n.node_id not in free:
            continue
        if g.gpu_model is not None and (n.gpu_model or "").lower() != g.gpu_model.lower():
            continue
        k = min(_copies(g.per_worker, free[n.node_id]), g.workers)
        if k > 0:
            rooms.append(k)
    total = 0
    for i, k in enumerate(sorted(rooms, reverse=True), start=1):
        total += k
        if total >= g.workers:
            return i
    return None


def _random_snapshot(rng: random.Random):
    nodes = []
    for i in range(rng.randint(0, 6)):
        gpus = rng.choice([0, 2, 4, 8])
        cpus = rng.choice([4, 8, 16, 32])
        mem = rng.choice([16, 64, 128])
        nodes.append(
            node(
                f"n{i}",
                name=rng.choice(["alpha", "beta", "gamma", "delta"]) + str(i),
                gpus=gpus,
                cpus=cpus,
                memory=mem * GiB,
                used_gpus=rng.choice([0, 0, rng.randint(0, gpus)]),
                used_cpus=rng.choice([0, 0, rng.randint(0, cpus)]),
                used_memory=rng.choice([0, 0, rng.randint(0, mem)]) * GiB,
                gpu_model=rng.choice([None, "A100", "H100"]) if gpus else None,
                schedulable=rng.random() > 0.15,
            )
        )
    gangs = [
        gang(
            f"g{j}",
            workers=rng.randint(1, 5),
            gpus=rng.choice([0, 1, 1, 2, 4]),
            cpus=rng.choice([0, 0.5, 1, 2, 4]),
            memory=rng.choice([0, 4, 8, 32]) * GiB,
            gpu_model=rng.choice([None, None, None, "a100", "H100", "V100"]),
            priority=rng.choice([0, 0, 1, 5]),
            submitted_at=float(rng.randint(0, 10)),
            team=rng.choice(["t", "u"]),
        )
        for j in range(rng.randint(0, 7))
    ]
    return snapshot(nodes, gangs)


def _check_common(snap, decisions) -> None:
    """For every policy: one decision per gang; admits on schedulable nodes of the
    asked model, within free capacity in every dimension; never_fits exactly when the
    empty schedulable cluster could not hold the gang."""
    nodes = {n.node_id: n for n in snap.nodes}
    gangs = {g.workload_id: g for g in snap.pending}
    assert sorted(by_id(decisions)) == sorted(gangs)
    for wid, placement in admits(decisions).items():
        g = gangs[wid]
        assert len(placement) == g.workers
        for nid in placement:
            assert nodes[nid].schedulable
            model = (nodes[nid].gpu_model or "").lower()
            assert g.gpu_model is None or model == g.gpu_model.lower()
    for nid, used in usage_per_node(snap, decisions).items():
        free = nodes[nid].free
        assert used.cpus <= free.cpus + 1e-9, (nid, used, free)
        assert used.memory <= free.memory, (nid, used, free)
        assert used.gpus <= free.gpus, (nid, used, free)
    empty = {n.node_id: n.capacity for n in snap.nodes if n.schedulable}
    for wid, w in waits(decisions).items():
        never = _fewest_nodes(gangs[wid], snap.nodes, empty) is None
        if w.never_fits:
            assert never and w.reason.startswith("could never fit"), w
        elif not w.reason.startswith("queued behind"):  # fifo's blocked gangs are not judged
            assert not never, w


def _leftover(snap, decisions) -> dict[str, Res]:
    free = {n.node_id: n.free for n in snap.nodes if n.schedulable}
    for nid, used in usage_per_node(snap, decisions).items():
        free[nid] = free[nid] - used
    return free


@ALL
def test_randomized_snapshots_respect_capacity_gangs_and_never_fits(policy):
    rng = random.Random(20240601)
    for _ in range(300):
        snap = _random_snapshot(rng)
        decisions = plan(snap, policy)
        _check_common(snap, decisions)
        assert plan(snap, policy) == decisions
        if policy == "fair":  # work conserving: what waits for room does not fit what is left
            left = _leftover(snap, decisions)
            gangs = {g.workload_id: g for g in snap.pending}
            for wid, w in waits(decisions).items():
                if not w.never_fits:
                    assert _fewest_nodes(gangs[wid], snap.nodes, left) is None, (w, left)


def test_randomized_fifo_replays_strict_queue_order():
    """fifo against an independent replay: in FCFS order, a gang behind a blocker is
    "queued behind" it; else one that fits the free capacity is admitted on the fewest
    nodes; else it could never fit (skipped) or it waits and blocks the rest."""
    rng = random.Random(20240602)
    seen = dict.fromkeys(["admit", "multi-node admit", "never fits", "waiting", "queued"], 0)
    for _ in range(500):
        snap = _random_snapshot(rng)
        decisions = plan(snap, "fifo")
        _check_common(snap, decisions)
        gangs = {g.workload_id: g for g in snap.pending}
        assert [d.workload_id for d in decisions] == [
            g.workload_id for g in sorted(snap.pending, key=arrival_key)
        ]
        empty = {n.node_id: n.capacity for n in snap.nodes if n.schedulable}
        free = {n.node_id: n.free for n in snap.nodes if n.schedulable}
        blocker = None
        for d in decisions:
            g = gangs[d.workload_id]
            if blocker is not None:
                assert d == Wait(g.workload_id, f"queued behind {blocker}", WaitKind.QUEUED_BEHIND)
                seen["queued"] += 1
            elif _fewest_nodes(g, snap.nodes, empty) is None:
                assert isinstance(d, Wait) and d.never_fits, d
                seen["never fits"] += 1
            elif (fewest := _fewest_nodes(g, snap.nodes, free)) is not None:
                assert isinstance(d, Admit), d
                assert len(set(d.placement)) == fewest, (d, fewest)
                for nid in d.placement:
                    free[nid] = free[nid] - g.per_worker
                seen["admit"] += 1
                seen["multi-node admit"] += fewest > 1
            else:
                assert isinstance(d, Wait) and not d.never_fits, d
                blocker = g.workload_id
                seen["waiting"] += 1
    # every outcome is exercised, so the checks above are not vacuous
    assert all(count >= 20 for count in seen.values()), seen
