"""ReplicaId: the one place that makes and parses a replica's workload and gang ids."""

from __future__ import annotations

import dataclasses

import pytest

from aicluster.core.replica import GANG_PREFIX, REPLICA_PREFIX, ReplicaId

STORED = ["chat-1a2b3c", "a-000000", "llama-70b-ffffff", "x"]


def test_the_wire_formats_do_not_change():
    # Running gangs and stored state are recognised after an upgrade only if these stay.
    assert (REPLICA_PREFIX, GANG_PREFIX) == ("replica:", "svc-")
    rid = ReplicaId("chat-1a2b3c")
    assert rid.workload_id == "replica:chat-1a2b3c"
    assert rid.gang_id == "svc-chat-1a2b3c"
    assert str(rid) == rid.value == "chat-1a2b3c"


@pytest.mark.parametrize("stored", STORED)
def test_workload_id_round_trip(stored):
    rid = ReplicaId(stored)
    assert ReplicaId.from_workload_id(rid.workload_id) == rid
    assert ReplicaId.from_workload_id(rid.workload_id).value == stored


@pytest.mark.parametrize("stored", STORED)
def test_gang_id_round_trip(stored):
    rid = ReplicaId(stored)
    assert ReplicaId.from_gang_id(rid.gang_id) == rid
    assert ReplicaId.from_gang_id(rid.gang_id).value == stored


@pytest.mark.parametrize("stored", STORED)
def test_workload_id_to_gang_id(stored):
    rid = ReplicaId.from_workload_id(REPLICA_PREFIX + stored)
    assert rid is not None and rid.gang_id == GANG_PREFIX + stored


@pytest.mark.parametrize(
    "text",
    [
        "train-1a2b3c",  # a job's workload id
        "",
        "replica:",  # a prefix with no id
        "replica",
        "Replica:chat-1a2b3c",
        " replica:chat-1a2b3c",
        "xreplica:chat-1a2b3c",
        "svc-chat-1a2b3c",  # the gang form is not a workload id
    ],
)
def test_non_replica_workload_ids(text):
    assert ReplicaId.from_workload_id(text) is None


@pytest.mark.parametrize(
    "text",
    [
        "train-1a2b3c",  # a job's gang
        "",
        "svc-",
        "svc",
        "SVC-chat-1a2b3c",
        "xsvc-chat-1a2b3c",
        "replica:chat-1a2b3c",  # the workload form is not a gang id
    ],
)
def test_non_replica_gang_ids(text):
    assert ReplicaId.from_gang_id(text) is None


def test_equal_and_hashable_by_value():
    assert ReplicaId("chat-1a2b3c") == ReplicaId("chat-1a2b3c")
    assert ReplicaId("chat-1a2b3c") != ReplicaId("chat-000000")
    assert len({ReplicaId("a-1"), ReplicaId("a-1"), ReplicaId("a-2")}) == 2


def test_frozen():
    rid = ReplicaId("chat-1a2b3c")
    with pytest.raises(dataclasses.FrozenInstanceError):
        rid.value = "other"  # type: ignore[misc]


@pytest.mark.parametrize("bad", ["", None, 7])
def test_empty_or_non_string_is_not_an_id(bad):
    with pytest.raises(ValueError):
        ReplicaId(bad)  # type: ignore[arg-type]
