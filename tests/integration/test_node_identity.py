"""A node is a machine: a machine killed and started again (a new Ray node id, carrying the
same machine label) is the same node coming back, with the same name, one more
incarnation, and an admin's cordon kept; it is never listed twice."""

from __future__ import annotations

import uuid

from aicluster.client.api import node_action
from aicluster.engine.protocol import MACHINE_LABEL, POOL_LABEL

from harness import COMMON_NODE_ARGS, wait_for


def test_a_machine_that_rejoins_is_the_same_node_again(ray_cluster, admin):
    cluster, _ = ray_cluster
    machine = uuid.uuid4().hex
    labels = {MACHINE_LABEL: machine, POOL_LABEL: "rejoin", "rack": "r9"}

    def start():
        return cluster.add_node(num_cpus=1, labels=labels, **COMMON_NODE_ARGS)

    def listed() -> list[dict]:
        return [n for n in admin.nodes() if n["machine_id"] == machine]

    def current(node, incarnations: int) -> dict:
        """The machine once it is listed as `node`'s incarnation, and only as that."""
        return wait_for(
            lambda: (
                (ns := listed())
                and [n["node_id"] for n in ns] == [node.node_id]
                and ns[0]["incarnations"] == incarnations
                and ns[0]
            ),
            timeout=60,
            what=f"incarnation {incarnations} of the machine",
        )

    node = start()
    first = current(node, 1)
    assert first["state"] == "Ready" and first["alive"]
    assert first["name"].endswith("-" + machine[:6])
    assert first["labels"] == {POOL_LABEL: "rejoin", "rack": "r9"}, "the machine id is no label"

    # Killed; Ray declares it dead; the same machine starts again.
    cluster.remove_node(node, allow_graceful=False)
    wait_for(lambda: [n["state"] for n in listed()] == ["Down"], timeout=60, what="Down")
    node = start()
    second = current(node, 2)
    assert (second["state"], second["name"]) == ("Ready", first["name"])
    assert second["node_id"] != first["node_id"]
    retired = [e for e in admin.events(object_id=first["node_id"]) if e["type"] == "NodeRetired"]
    assert [(e["from_status"], e["to_status"]) for e in retired] == [("Down", "Retired")]
    assert retired[0]["message"] == f"rejoined as incarnation {node.node_id[:8]}"

    # Cordoned by its machine id, killed and started again at once (before Ray has
    # declared the old incarnation dead, most likely): it comes back Cordoned.
    assert node_action(admin, machine, "cordon")["state"] == "Cordoned"
    cluster.remove_node(node, allow_graceful=False)
    node = start()
    try:
        third = wait_for(
            lambda: (n := current(node, 3))["state"] == "Cordoned" and n,
            timeout=30,
            what="the rejoined machine Cordoned",
        )
        assert third["name"] == first["name"] and third["reason"] == "cordoned by admin"
        rejoins = [e for e in admin.events(object_id=machine) if e["type"] == "NodeRejoined"]
        assert [(e["from_status"], e["to_status"]) for e in rejoins] == [
            ("Ready", "Ready"),
            ("Cordoned", "Cordoned"),
        ]
        assert f"incarnation 3 is node {node.node_id}" in rejoins[-1]["message"]
        # The stable name names it too; the Ray node id still does.
        assert node_action(admin, first["name"], "uncordon")["state"] == "Ready"
        assert node_action(admin, node.node_id[:16], "cordon")["node_id"] == node.node_id
        assert node_action(admin, machine[:12], "uncordon")["state"] == "Ready"
    finally:
        cluster.remove_node(node, allow_graceful=True)
    wait_for(lambda: [n["state"] for n in listed()] == ["Down"], timeout=60, what="Down")
    assert node_action(admin, machine, "retire")["state"] == "Retired"
    assert listed() == []
