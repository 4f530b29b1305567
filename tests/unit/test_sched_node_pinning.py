"""A job pinned to nodes (spec `nodes`, GangRequest.nodes): the spec field, and the
scheduler using those nodes only, waiting for them, and naming them when it never could."""

from __future__ import annotations

from dataclasses import replace

import pytest

from aicluster.control.snapshot import job_workload
from aicluster.core.lifecycle import JobStatus
from aicluster.core.model import Admit, Wait, WaitKind
from aicluster.core.scheduler import POLICY_NAMES, plan_cycle
from aicluster.specs import JobSpec, SpecError, load_spec_text
from aicluster.store.jobs import JobRecord

from builders import admits, by_id, gang, node, snapshot, waits
from sched_helpers import qsnap, running

SPEC = "kind: job\nname: j\ncommand: run\n"


def pinned(workload_id, nodes, **kw):
    return replace(gang(workload_id, **kw), nodes=frozenset(nodes))


# -- the spec ------------------------------------------------------------------------


def test_nodes_are_kept_and_default_to_any_node():
    assert load_spec_text(SPEC).nodes is None
    spec = load_spec_text(SPEC + "nodes: [n0001, 0a1b2c3d4e5f, host-1.rack:2]\n")
    assert spec.nodes == ["n0001", "0a1b2c3d4e5f", "host-1.rack:2"]
    assert JobSpec.model_validate(spec.model_dump()).nodes == spec.nodes


@pytest.mark.parametrize(
    "value, words",
    [
        ("[]", "at least 1"),
        ("n0001", "valid list"),
        ("['a b']", "invalid node id 'a b'"),
        ("['-x']", "invalid node id '-x'"),
        (f"[{'x' * 129}]", "at most 128"),
        ("[n1, n2, n1]", "'n1' is named twice"),
        ("[1]", "valid string"),
    ],
)
def test_bad_nodes_are_a_spec_error_naming_the_field(value, words):
    with pytest.raises(SpecError) as info:
        load_spec_text(SPEC + f"nodes: {value}\n")
    (issue,) = info.value.issues
    assert issue.field.split(".")[0] == "nodes" and words in issue.message, issue
    assert info.value.to_dict()["issues"][0]["field"].startswith("nodes")  # the API's 422


def test_too_many_nodes_are_refused():
    with pytest.raises(SpecError) as info:
        load_spec_text(SPEC + "nodes: [" + ", ".join(f"n{i}" for i in range(4097)) + "]\n")
    assert info.value.issues[0].field == "nodes"


def record(spec: JobSpec) -> JobRecord:
    fields = dict.fromkeys(JobRecord.__dataclass_fields__)
    fields.update(id="j1", seq=1, name="j", team="default", owner="u", spec=spec)
    fields.update(status=JobStatus.PENDING, priority=0, restarts=0, attempt=0)
    fields.update(created_at=1.0, updated_at=1.0)
    return JobRecord(**fields)


def test_the_control_plane_passes_the_nodes_to_the_gang():
    spec = load_spec_text(SPEC + "workers: 2\nnodes: [a, b]\n")
    assert job_workload(record(spec)).gang().nodes == frozenset({"a", "b"})
    assert job_workload(record(load_spec_text(SPEC))).gang().nodes is None


# -- the scheduler -------------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_a_pinned_gang_waits_for_its_busy_nodes_although_others_are_free(policy):
    nodes = [node("a", gpus=8, used_gpus=4), node("b", gpus=8), node("c", gpus=8)]
    (d,) = plan_cycle(snapshot(nodes, [pinned("g", ["a"], gpus=8)]), 0.0, policy)
    assert isinstance(d, Wait) and d.kind is WaitKind.CAPACITY and not d.never_fits
    assert "waiting for its nodes a in pool default" in d.reason, d.reason
    assert "4 GPUs free on them" in d.reason, d.reason


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_a_pinned_gang_lands_only_on_its_nodes(policy):
    # Unpinned, best fit would take the fullest node (c) and the fewest nodes.
    nodes = [node("a", gpus=8), node("b", gpus=8), node("c", gpus=8, used_gpus=6)]
    decisions = plan_cycle(
        snapshot(
            nodes,
            [
                pinned("two", ["a", "b"], workers=2, gpus=8),
                pinned("small", ["b", "c", "a"], workers=2, gpus=1),
            ],
        ),
        0.0,
        policy,
    )
    assert sorted(admits(decisions)["two"]) == ["a", "b"]
    assert admits(decisions)["small"] == ("c", "c")  # any of its nodes; best fit among them
    one = plan_cycle(snapshot(nodes, [pinned("g", ["a"], workers=2, gpus=1)]), 0.0, policy)
    assert one == [Admit("g", ("a", "a"))]


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_naming_an_unknown_or_unschedulable_node_never_fits_and_names_it(policy):
    nodes = [node("a", gpus=8), node("b", gpus=8, schedulable=False)]
    decisions = by_id(
        plan_cycle(
            snapshot(
                nodes,
                [
                    pinned("ghost", ["zz9"], gpus=1),
                    pinned("cordoned", ["b"], gpus=1),
                    pinned("half", ["a", "zz9"], workers=2, gpus=8),
                    pinned("small", ["a"], gpus=16),
                    pinned("model", ["a"], gpus=1, gpu_model="H100"),
                ],
            ),
            0.0,
            policy,
        )
    )
    assert all(d.never_fits for d in decisions.values()), decisions
    assert "no schedulable node zz9" in decisions["ghost"].reason
    assert "no schedulable node b " in decisions["cordoned"].reason
    half = decisions["half"].reason
    assert "its nodes a, zz9 include no schedulable node zz9" in half, half
    assert "its nodes a do not hold it even when idle" in decisions["small"].reason
    assert "no H100 GPUs on a" in decisions["model"].reason


def test_a_named_missing_node_is_no_obstacle_when_the_others_hold_the_gang():
    (d,) = plan_cycle(snapshot([node("a", gpus=8)], [pinned("g", ["a", "zz"], gpus=8)]), 0.0)
    assert d == Admit("g", ("a",))


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_the_refusal_memo_never_mixes_gangs_pinned_to_different_nodes(policy):
    # Same team, same size; the first is refused (its node is busy), the ones behind it
    # must each be judged on their own nodes.
    # (a's holder has a runtime limit, so backfill knows when `on-a` could start.)
    nodes = [node("a", gpus=8), node("b", gpus=8), node("c", gpus=8)]
    holder = running(replace(gang("r", gpus=8, team="u"), runtime_limit=100.0), ["a"])
    gangs = [
        pinned("on-a", ["a"], gpus=8, submitted_at=0.0),
        pinned("on-b", ["b"], gpus=8, submitted_at=1.0),
        pinned("on-a2", ["a"], gpus=8, submitted_at=2.0),
        gang("any", gpus=8, submitted_at=3.0),
    ]
    assert gangs[0].shape != gangs[1].shape and gangs[0].shape == gangs[2].shape
    assert gangs[3].shape != gangs[1].shape
    decisions = plan_cycle(qsnap(nodes, gangs, [holder]), 0.0, policy)
    got = admits(decisions)
    assert "its nodes a" in waits(decisions)["on-a"].reason
    if policy == "fifo":  # strict order: the head waits and so does everyone behind it
        assert not got
    else:
        assert got == {"on-b": ("b",), "any": ("c",)}
        assert "its nodes a" in waits(decisions)["on-a2"].reason
