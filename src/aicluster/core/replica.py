"""Replica lifecycle: statuses, reasons and the table of legal transitions.

    PENDING -> STARTING -> READY -> STOPPED | FAILED

PENDING waits for the scheduler; STARTING has a node and an engine process that
is not answering its health check yet; READY is in the gateway's endpoint table.
A replica that fails is never restarted in place: the service loop creates a new
one, so a replica id names one process on one node for its whole life.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

# The two prefixed forms of a replica id, as the scheduler and the engine see them.
# They are stored and live on in running gangs, so they never change.
REPLICA_PREFIX = "replica:"  # the replica's workload id in the scheduler's snapshot
GANG_PREFIX = "svc-"  # the engine's job id of the replica's gang (one worker, attempt 1)


@dataclass(frozen=True, slots=True)
class ReplicaId:
    """A replica id as stored (`value`), and the only code that makes or parses its
    workload id (`replica:<id>`) and gang id (`svc-<id>`)."""

    value: str

    def __post_init__(self) -> None:
        if not isinstance(self.value, str) or not self.value:
            raise ValueError(f"a replica id is a non-empty string, not {self.value!r}")

    def __str__(self) -> str:
        return self.value

    @property
    def workload_id(self) -> str:
        return REPLICA_PREFIX + self.value

    @property
    def gang_id(self) -> str:
        return GANG_PREFIX + self.value

    @classmethod
    def from_workload_id(cls, workload_id: str) -> ReplicaId | None:
        """The replica a scheduler workload id names; None for a job's workload."""
        return cls._parse(workload_id, REPLICA_PREFIX)

    @classmethod
    def from_gang_id(cls, gang_id: str) -> ReplicaId | None:
        """The replica an engine gang's job id names; None for a job's gang."""
        return cls._parse(gang_id, GANG_PREFIX)

    @classmethod
    def _parse(cls, text: str, prefix: str) -> ReplicaId | None:
        if not text.startswith(prefix) or len(text) == len(prefix):
            return None
        return cls(text[len(prefix) :])


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
