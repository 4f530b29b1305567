"""Replica lifecycle: statuses, reasons and the table of legal transitions.

    PENDING -> STARTING -> READY -> STOPPED | FAILED

PENDING waits for the scheduler; STARTING has a node and an engine process that
is not answering its health check yet; READY is in the gateway's endpoint table.
A replica that fails is never restarted in place: the service loop creates a new
one, so a replica id names one process on one node for its whole life.
"""

from __future__ import annotations

from enum import StrEnum


class ReplicaStatus(StrEnum):
    PENDING = "PENDING"
    STARTING = "STARTING"
    READY = "READY"
    STOPPED = "STOPPED"
    FAILED = "FAILED"

    @property
    def terminal(self) -> bool:
        return self in (ReplicaStatus.STOPPED, ReplicaStatus.FAILED)


class ReplicaReason(StrEnum):
    CREATED = "created"
    PLACED = "placed"
    HEALTHY = "healthy"
    SCALED_DOWN = "scaled_down"
    NODE_DRAINED = "node_drained"
    PREEMPTED = "preempted"
    DELETED = "deleted"
    LAUNCH_FAILED = "launch_failed"
    NOT_READY_IN_TIME = "not_ready_in_time"
    ENGINE_EXITED = "engine_exited"
    NODE_LOST = "node_lost"
    WORKER_LOST = "worker_lost"


LIVE = frozenset({ReplicaStatus.PENDING, ReplicaStatus.STARTING, ReplicaStatus.READY})

REPLICA_TRANSITIONS: dict[ReplicaStatus, frozenset[ReplicaStatus]] = {
    ReplicaStatus.PENDING: frozenset({ReplicaStatus.STARTING, ReplicaStatus.STOPPED}),
    ReplicaStatus.STARTING: frozenset(
        {ReplicaStatus.READY, ReplicaStatus.FAILED, ReplicaStatus.STOPPED}
    ),
    ReplicaStatus.READY: frozenset({ReplicaStatus.FAILED, ReplicaStatus.STOPPED}),
    ReplicaStatus.STOPPED: frozenset(),
    ReplicaStatus.FAILED: frozenset(),
}


def check_replica_transition(src: ReplicaStatus, dst: ReplicaStatus) -> None:
    if dst not in REPLICA_TRANSITIONS[src]:
        raise ValueError(f"illegal replica transition {src} -> {dst}")
