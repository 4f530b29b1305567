"""`FreeIndex.slots_if_freed` is an upper bound (core.topology): whenever a gang can be
placed after some running gangs are released, the bound counts at least its workers, so
a preemptor that gives up when the bound is short (core.policies.las RankedPreemptor)
never gives up on a preemption that would have worked."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from aicluster.core.model import Res
from aicluster.core.topology import FreeIndex

from builders import gang, node


@st.composite
def cases(draw):
    n = draw(st.integers(1, 6))
    nodes = []
    for i in range(n):
        gpus = draw(st.sampled_from([4, 8]))
        nodes.append(
            replace(
                node(f"n{i}", gpus=gpus, used_gpus=draw(st.integers(0, gpus)), cpus=64),
                rack=f"r{i % 2}",
            )
        )
    running = []  # (placement, GPUs per rank) released from the index
    for _ in range(draw(st.integers(0, 5))):
        ranks = draw(st.integers(1, 3))
        placement = tuple(draw(st.sampled_from(nodes)).node_id for _ in range(ranks))
        running.append((placement, draw(st.sampled_from([1, 2, 4]))))
    want = replace(
        gang("g", workers=draw(st.integers(1, 6)), gpus=draw(st.sampled_from([1, 2, 4, 8]))),
        locality=draw(st.sampled_from(["pool", "rack", "node"])),
    )
    held = draw(st.sets(st.sampled_from([x.node_id for x in nodes]), max_size=2))
    return nodes, running, want, held


@settings(max_examples=300, deadline=None)
@given(case=cases())
def test_the_bound_is_never_below_a_placement_that_exists(case):
    nodes, running, want, held = case
    index = FreeIndex(nodes)
    index.hold(held)
    freed: Counter = Counter()
    for placement, each in running:
        for node_id in placement:
            freed[node_id] += each
    bound = index.slots_if_freed("default", want.per_worker.gpus, dict(freed))
    for placement, each in running:
        index.release(placement, Res(0, 0, each))
    if index.place(want, "default") is not None:
        assert bound >= want.workers


def test_the_bound_counts_slots_on_freed_nodes_only_where_release_would_free_them():
    nodes = [node("a", gpus=8, used_gpus=8), node("b", gpus=8, used_gpus=6)]
    index = FreeIndex(nodes)
    assert index.slots_if_freed("default", 4, {}) == 0  # b has 2 free
    assert index.slots_if_freed("default", 4, {"a": 8}) == 2
    assert index.slots_if_freed("default", 4, {"b": 2}) == 1
    index.hold(["a"])  # a held node gets nothing back from a release
    assert index.slots_if_freed("default", 4, {"a": 8, "b": 2}) == 1
    assert index.slots_if_freed("nowhere", 4, {"a": 8}) == 0
