"""Artifact locality is a soft placement preference, for every policy."""

from __future__ import annotations

import pytest

from aicluster.core.model import Admit, GangRequest, NodeView, Res, Snapshot, Wait
from aicluster.core.scheduler import POLICY_NAMES, plan_cycle


def node(name: str, gpus_used: int = 0) -> NodeView:
    return NodeView(name, name, Res(16, 2**36, 8), Res(0, 0, gpus_used), pool="p")


def gang(preferred=(), gpus=2) -> GangRequest:
    return GangRequest("w1", "t", 1, Res(1, 0, gpus), preferred_nodes=preferred)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_a_node_that_caches_the_artifacts_is_preferred(policy):
    nodes = (node("a"), node("b"), node("c"))
    assert plan_cycle(Snapshot(nodes, (gang(),)), 0.0, policy) == [Admit("w1", ("a",))]
    assert plan_cycle(Snapshot(nodes, (gang(("c",)),)), 0.0, policy) == [Admit("w1", ("c",))]


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_a_full_or_unknown_preferred_node_is_only_a_hint(policy):
    nodes = (node("a"), node("b", gpus_used=7))
    decisions = plan_cycle(Snapshot(nodes, (gang(("b", "gone")),)), 0.0, policy)
    assert decisions == [Admit("w1", ("a",))]
    too_big = plan_cycle(Snapshot(nodes, (gang(("a",), gpus=9),)), 0.0, policy)
    assert isinstance(too_big[0], Wait)
