"""Job lifecycle: statuses, reasons and the table of legal transitions.

    PENDING -> ADMITTED -> RUNNING -> SUCCEEDED | FAILED(reason) | CANCELLED(by whom)

A job may also go back to PENDING (requeued after a node loss, within its restart
budget) and may fail or be cancelled from any non-terminal status. Terminal
statuses never change again.
"""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    PENDING = "PENDING"
    ADMITTED = "ADMITTED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


class Reason(StrEnum):
    """Why a job left a status; recorded on the transition and on the job."""

    SUBMITTED = "submitted"
    ADMITTED = "admitted"
    STARTED = "started"
    EXIT_CODE = "exit_code"  # a worker's command exited non-zero
    COMPLETED = "completed"  # every worker exited 0
    NODE_LOST = "node_lost"  # a node running a worker died
    NODE_UNHEALTHY = "node_unhealthy"  # a worker died on a node its health checks failed
    NODE_DRAINED = "node_drained"  # stopped at the end of its node's drain grace period
    PREEMPTED = "preempted"  # stopped by the scheduler to give capacity back to a team
    INPUT_UNAVAILABLE = "input_unavailable"  # an input artifact cannot be read
    OUTPUT_FAILED = "output_failed"  # the command succeeded but an output could not be stored
    LAUNCH_FAILED = "launch_failed"  # the engine could not start the gang
    ENVIRONMENT_FAILED = "environment_failed"  # its `environment` could not be built
    WORKER_LOST = "worker_lost"  # a worker process vanished while the node lives
    CANCELLED_BY_USER = "cancelled_by_user"
    COULD_NEVER_FIT = "could_never_fit"  # larger than the cluster for max_pending_seconds
    REQUEUED = "requeued"  # back to PENDING to restart after a failure


class RequeueCause(StrEnum):
    """Why a job went back to PENDING (its reason is then `requeued`); kept on the job,
    shown as text only at the edges (API, metrics labels, messages)."""

    NODE_LOST = "node_lost"
    NODE_UNHEALTHY = "node_unhealthy"
    WORKER_LOST = "worker_lost"
    LAUNCH_FAILED = "launch_failed"
    NODE_DRAINED = "node_drained"  # stopped at the end of its node's drain grace period
    PREEMPTED = "preempted"  # stopped by the scheduler (no restart is spent)
    CONTROL_PLANE_RESTARTED = "control_plane_restarted"  # a launch that no one finished


TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})

TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.PENDING: frozenset({JobStatus.ADMITTED, JobStatus.FAILED, JobStatus.CANCELLED}),
    JobStatus.ADMITTED: frozenset(
        {JobStatus.RUNNING, JobStatus.PENDING, JobStatus.FAILED, JobStatus.CANCELLED}
    ),
    JobStatus.RUNNING: frozenset(
        {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.PENDING}
    ),
    JobStatus.SUCCEEDED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELLED: frozenset(),
}


class IllegalTransition(ValueError):
    def __init__(self, src: JobStatus, dst: JobStatus):
        super().__init__(f"illegal job transition {src} -> {dst}")
        self.src, self.dst = src, dst


def can_transition(src: JobStatus, dst: JobStatus) -> bool:
    return dst in TRANSITIONS[src]


def check_transition(src: JobStatus, dst: JobStatus) -> None:
    if not can_transition(src, dst):
        raise IllegalTransition(src, dst)


# Infrastructure failures, retried within max_restarts, and the requeue cause each gives.
_RETRYABLE: dict[Reason, RequeueCause] = {
    Reason.NODE_LOST: RequeueCause.NODE_LOST,
    Reason.NODE_UNHEALTHY: RequeueCause.NODE_UNHEALTHY,
    Reason.WORKER_LOST: RequeueCause.WORKER_LOST,
    Reason.LAUNCH_FAILED: RequeueCause.LAUNCH_FAILED,
}


def failure_is_retryable(reason: Reason) -> bool:
    """Infrastructure failures are retried within max_restarts; user errors are not."""
    return reason in _RETRYABLE


def requeue_cause_of(reason: Reason) -> RequeueCause:
    """The requeue cause of a retryable failure (see `failure_is_retryable`)."""
    return _RETRYABLE[reason]
