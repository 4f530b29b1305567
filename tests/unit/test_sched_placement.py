"""Topology-aware gang placement (core.topology) through core.scheduler.plan_cycle."""

from __future__ import annotations

from dataclasses import replace

import pytest

from aicluster.core.model import Admit, Wait, WaitKind
from aicluster.core.scheduler import plan_cycle
from aicluster.core.topology import FreeIndex

from builders import admits, gang, node, snapshot, waits


def rnode(node_id, rack=None, nvlink=None, pool="default", **kw):
    return replace(node(node_id, pool=pool, **kw), rack=rack, nvlink_domain=nvlink)


@pytest.mark.parametrize("policy", ["fifo", "backfill", "fair"])
def test_single_node_best_fit_picks_the_fullest_node_that_holds_it(policy):
    snap = snapshot(
        [
            rnode("a", gpus=8),
            rnode("b", gpus=8, used_gpus=5),
            rnode("c", gpus=8, used_gpus=6),
        ],
        [gang("g", gpus=2)],
    )
    assert plan_cycle(snap, 0.0, policy) == [Admit("g", ("c",))]


@pytest.mark.parametrize("policy", ["fifo", "backfill", "fair"])
def test_fewest_nodes_before_rack(policy):
    # Two whole free nodes in different racks beat three nodes in one rack.
    nodes = [
        rnode("a1", rack="A", gpus=8, used_gpus=4),
        rnode("a2", rack="A", gpus=8, used_gpus=4),
        rnode("a3", rack="A", gpus=8, used_gpus=4),
        rnode("b1", rack="B", gpus=8),
        rnode("c1", rack="C", gpus=8),
    ]
    (d,) = plan_cycle(snapshot(nodes, [gang("g", workers=2, gpus=8)]), 0.0, policy)
    assert isinstance(d, Admit) and sorted(set(d.placement)) == ["b1", "c1"]


def test_within_one_rack_at_equal_node_count():
    nodes = [
        rnode("a1", rack="A", gpus=8),
        rnode("b1", rack="B", gpus=8),
        rnode("b2", rack="B", gpus=8),
        rnode("c1", rack="C", gpus=8),
    ]
    (d,) = plan_cycle(snapshot(nodes, [gang("g", workers=2, gpus=8)]), 0.0, "fair")
    assert sorted(d.placement) == ["b1", "b2"]


def test_nvlink_domain_preferred_over_rack():
    nodes = [
        rnode("a1", rack="A", gpus=4),
        rnode("a2", rack="A", gpus=4),
        rnode("n1", rack="B", nvlink="nvl", gpus=4),
        rnode("n2", rack="C", nvlink="nvl", gpus=4),
    ]
    (d,) = plan_cycle(snapshot(nodes, [gang("g", workers=2, gpus=4)]), 0.0, "fair")
    assert sorted(d.placement) == ["n1", "n2"]


def test_best_fit_on_the_last_node_limits_fragmentation():
    nodes = [rnode("a", gpus=8), rnode("b", gpus=8), rnode("c", gpus=8, used_gpus=6)]
    (d,) = plan_cycle(snapshot(nodes, [gang("g", workers=10, gpus=1)]), 0.0, "fair")
    assert sorted(d.placement).count("c") == 2 and len(set(d.placement)) == 2


def test_locality_rack_waits_with_a_reason_instead_of_spanning_racks():
    nodes = [rnode("a1", rack="A", gpus=8), rnode("b1", rack="B", gpus=8)]
    g = replace(gang("g", workers=2, gpus=8), locality="rack")
    (d,) = plan_cycle(snapshot(nodes, [g]), 0.0, "fair")
    assert isinstance(d, Wait) and d.never_fits
    nodes.append(rnode("b2", rack="B", gpus=8, used_gpus=4))
    (d,) = plan_cycle(snapshot(nodes, [g]), 0.0, "fair")
    assert isinstance(d, Wait) and not d.never_fits
    assert "needs 16 GPUs within one rack" in d.reason
    assert d.kind is WaitKind.LOCALITY


def test_a_gang_never_spans_pools():
    nodes = [rnode("a", gpus=8, pool="p1"), rnode("b", gpus=8, pool="p2")]
    (d,) = plan_cycle(snapshot(nodes, [gang("g", workers=2, gpus=8)]), 0.0, "fair")
    assert isinstance(d, Wait) and d.never_fits


def test_gang_pool_is_honoured():
    nodes = [rnode("a", gpus=8, pool="p1"), rnode("b", gpus=8, pool="p2")]
    g = replace(gang("g", gpus=1), pool="p2")
    assert plan_cycle(snapshot(nodes, [g]), 0.0, "fair") == [Admit("g", ("b",))]


@pytest.mark.parametrize("policy", ["fifo", "backfill", "fair"])
def test_gpu_model_is_honoured(policy):
    nodes = [rnode("a", gpus=8, gpu_model="A100"), rnode("b", gpus=8, gpu_model="H100")]
    decisions = plan_cycle(
        snapshot(nodes, [gang("g", gpus=8, gpu_model="h100"), gang("x", gpus=1, gpu_model="V100")]),
        0.0,
        policy,
    )
    assert admits(decisions) == {"g": ("b",)}
    assert waits(decisions)["x"].never_fits and "V100" in waits(decisions)["x"].reason


def test_free_index_take_release_round_trip():
    nodes = [rnode(f"n{i}", rack="A", gpus=8) for i in range(3)]
    idx = FreeIndex(nodes)
    g = gang("g", workers=3, gpus=4)
    p = idx.place(g, "default")
    assert p is not None and len(set(p)) == 2
    idx.take(p, g.per_worker)
    assert idx.pool_free_gpus("default") == 12
    idx.release(p, g.per_worker)
    assert idx.pool_free_gpus("default") == 24
    assert {k: v for k, v in idx.free.items()} == {n.node_id: n.free for n in nodes}
