"""Node states: what the scheduler may do with a node, and why.

    READY <-> DEGRADED (health checks fail / pass again)
    READY | DEGRADED -> CORDONED (admin: no new work) -> READY (uncordon)
    READY | DEGRADED | CORDONED -> DRAINING (admin: no new work, running work moves
                                  off within a grace period) -> CORDONED when empty
    any -> DOWN (Ray lost the node) -> READY | DEGRADED (it came back)

Only READY nodes take new work. An admin's CORDONED/DRAINING is never undone by a
health check passing; DOWN wins over everything.
"""

from __future__ import annotations

from enum import StrEnum


class NodeState(StrEnum):
    READY = "Ready"
    DEGRADED = "Degraded"
    DRAINING = "Draining"
    CORDONED = "Cordoned"
    DOWN = "Down"

    @property
    def schedulable(self) -> bool:
        return self == NodeState.READY


NODE_TRANSITIONS: dict[NodeState, frozenset[NodeState]] = {
    NodeState.READY: frozenset(
        {NodeState.DEGRADED, NodeState.CORDONED, NodeState.DRAINING, NodeState.DOWN}
    ),
    NodeState.DEGRADED: frozenset(
        {NodeState.READY, NodeState.CORDONED, NodeState.DRAINING, NodeState.DOWN}
    ),
    NodeState.CORDONED: frozenset({NodeState.READY, NodeState.DRAINING, NodeState.DOWN}),
    NodeState.DRAINING: frozenset({NodeState.CORDONED, NodeState.READY, NodeState.DOWN}),
    NodeState.DOWN: frozenset({NodeState.READY, NodeState.DEGRADED}),
}

ADMIN_STATES = frozenset({NodeState.CORDONED, NodeState.DRAINING})


def check_node_transition(src: NodeState, dst: NodeState) -> None:
    if dst not in NODE_TRANSITIONS[src]:
        raise ValueError(f"illegal node transition {src} -> {dst}")


def next_state(current: NodeState, alive: bool, healthy: bool) -> NodeState:
    """The state the facts call for, given the current one (admin states stick)."""
    if not alive:
        return NodeState.DOWN
    if current == NodeState.DOWN:
        return NodeState.READY if healthy else NodeState.DEGRADED
    if current in ADMIN_STATES:
        return current
    return NodeState.READY if healthy else NodeState.DEGRADED
