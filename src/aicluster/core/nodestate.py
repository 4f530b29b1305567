"""Node states: what the scheduler may do with a node, and why.

    READY <-> DEGRADED (health checks fail / pass again)
    READY | DEGRADED -> CORDONED (admin: no new work) -> READY (uncordon)
    READY | DEGRADED | CORDONED -> DRAINING (admin: no new work, running work moves
                                  off within a grace period) -> CORDONED when empty
    any -> DOWN (Ray lost the node) -> READY | DEGRADED (it came back)
    DOWN -> RETIRED (Down for longer than the control plane's --retire-down-after, or
                     an admin's `aicluster nodes rm`) -> READY | DEGRADED (it came back)

Only READY nodes take new work. An admin's CORDONED/DRAINING is never undone by a
health check passing; DOWN wins over everything.

RETIRED is the end of a dead node: it is no longer listed (API, CLI, metrics) and its
events keep its history. It is terminal for as long as the node stays dead; should Ray
report the same node id alive again, the node is READY (or DEGRADED) like any node that
comes back from DOWN, and listed again. Only a DOWN node is retired, never a live one.

A node record is one incarnation (Ray node id) of a machine. When the machine rejoins as a
new Ray node id, its earlier incarnation is dead whatever Ray says yet (a machine runs one
incarnation at a time): it goes to DOWN (if not there already) and on to RETIRED at once,
through the transitions above, and stays RETIRED for good (control.nodes_loop).
"""

from __future__ import annotations

from enum import StrEnum


class NodeState(StrEnum):
    READY = "Ready"
    DEGRADED = "Degraded"
    DRAINING = "Draining"
    CORDONED = "Cordoned"
    DOWN = "Down"
    RETIRED = "Retired"

    @property
    def schedulable(self) -> bool:
        return self == NodeState.READY

    @property
    def retired(self) -> bool:
        return self == NodeState.RETIRED


NODE_TRANSITIONS: dict[NodeState, frozenset[NodeState]] = {
    NodeState.READY: frozenset(
        {NodeState.DEGRADED, NodeState.CORDONED, NodeState.DRAINING, NodeState.DOWN}
    ),
    NodeState.DEGRADED: frozenset(
        {NodeState.READY, NodeState.CORDONED, NodeState.DRAINING, NodeState.DOWN}
    ),
    NodeState.CORDONED: frozenset({NodeState.READY, NodeState.DRAINING, NodeState.DOWN}),
    NodeState.DRAINING: frozenset({NodeState.CORDONED, NodeState.READY, NodeState.DOWN}),
    NodeState.DOWN: frozenset({NodeState.READY, NodeState.DEGRADED, NodeState.RETIRED}),
    NodeState.RETIRED: frozenset({NodeState.READY, NodeState.DEGRADED}),
}

ADMIN_STATES = frozenset({NodeState.CORDONED, NodeState.DRAINING})


def check_node_transition(src: NodeState, dst: NodeState) -> None:
    if dst not in NODE_TRANSITIONS[src]:
        raise ValueError(f"illegal node transition {src} -> {dst}")


def next_state(current: NodeState, alive: bool, healthy: bool) -> NodeState:
    """The state the facts call for, given the current one (admin states stick; a
    retired node stays retired while it is dead)."""
    if not alive:
        return NodeState.RETIRED if current == NodeState.RETIRED else NodeState.DOWN
    if current in (NodeState.DOWN, NodeState.RETIRED):
        return NodeState.READY if healthy else NodeState.DEGRADED
    if current in ADMIN_STATES:
        return current
    return NodeState.READY if healthy else NodeState.DEGRADED


def retire_due(state: NodeState, since: float, now: float, after_s: float | None) -> bool:
    """A node Down for longer than `after_s` seconds is retired; None (or <= 0): never."""
    return state == NodeState.DOWN and after_s is not None and after_s > 0 and now - since > after_s


def listed(state: NodeState | None, alive: bool) -> bool:
    """Whether a node Ray reports is shown (API, CLI, metrics): not when retired and dead."""
    return not (state == NodeState.RETIRED and not alive)
