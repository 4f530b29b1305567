"""Job lifecycle: the table of legal transitions, terminal statuses, retryable failures."""

from __future__ import annotations

import itertools

import pytest

from aicluster.core.lifecycle import (
    TERMINAL,
    TRANSITIONS,
    IllegalTransition,
    JobStatus,
    Reason,
    can_transition,
    check_transition,
    failure_is_retryable,
)

P, A, R = JobStatus.PENDING, JobStatus.ADMITTED, JobStatus.RUNNING
S, F, C = JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED

# The lifecycle as documented: forward P -> A -> R -> S, back to PENDING on requeue
# (from ADMITTED or RUNNING), FAILED/CANCELLED from any non-terminal status.
LEGAL = {
    (P, A),
    (P, F),
    (P, C),
    (A, R),
    (A, P),
    (A, F),
    (A, C),
    (R, S),
    (R, F),
    (R, C),
    (R, P),
}
ALL_PAIRS = list(itertools.product(JobStatus, JobStatus))
ILLEGAL = [pair for pair in ALL_PAIRS if pair not in LEGAL]


def test_transition_table_is_exactly_the_documented_lifecycle():
    assert set(TRANSITIONS) == set(JobStatus)
    table = {(src, dst) for src, dsts in TRANSITIONS.items() for dst in dsts}
    assert table == LEGAL


@pytest.mark.parametrize("src, dst", sorted(LEGAL), ids=lambda s: str(s))
def test_every_legal_transition_is_accepted(src, dst):
    assert can_transition(src, dst)
    check_transition(src, dst)  # does not raise


@pytest.mark.parametrize("src, dst", ILLEGAL, ids=lambda s: str(s))
def test_every_other_pair_raises_illegal_transition(src, dst):
    assert not can_transition(src, dst)
    with pytest.raises(IllegalTransition) as info:
        check_transition(src, dst)
    assert info.value.src == src
    assert info.value.dst == dst
    assert str(info.value) == f"illegal job transition {src} -> {dst}"


def test_pairs_are_split_exactly_into_legal_and_illegal():
    assert len(ALL_PAIRS) == 36
    assert len(LEGAL) + len(ILLEGAL) == 36


def test_illegal_transition_is_a_value_error():
    assert issubclass(IllegalTransition, ValueError)


@pytest.mark.parametrize("status", list(JobStatus))
def test_no_status_transitions_to_itself(status):
    assert not can_transition(status, status)


def test_terminal_statuses():
    assert {S, F, C} == TERMINAL
    assert {s for s in JobStatus if s.terminal} == {S, F, C}


@pytest.mark.parametrize("status", [S, F, C])
def test_terminal_statuses_have_no_exits(status):
    assert TRANSITIONS[status] == frozenset()
    for dst in JobStatus:
        with pytest.raises(IllegalTransition):
            check_transition(status, dst)


@pytest.mark.parametrize("status", [P, A, R])
def test_every_non_terminal_status_can_fail_or_be_cancelled(status):
    assert can_transition(status, F)
    assert can_transition(status, C)


def test_every_status_is_reachable_from_pending():
    seen, frontier = {P}, [P]
    while frontier:
        for dst in TRANSITIONS[frontier.pop()]:
            if dst not in seen:
                seen.add(dst)
                frontier.append(dst)
    assert seen == set(JobStatus)


def test_statuses_and_reasons_are_strings():
    assert JobStatus.RUNNING == "RUNNING"
    assert str(JobStatus.RUNNING) == "RUNNING"
    assert str(Reason.NODE_LOST) == "node_lost"


RETRYABLE = {Reason.NODE_LOST, Reason.NODE_UNHEALTHY, Reason.WORKER_LOST, Reason.LAUNCH_FAILED}


@pytest.mark.parametrize("reason", list(Reason))
def test_failure_is_retryable_only_for_infrastructure_failures(reason):
    assert failure_is_retryable(reason) is (reason in RETRYABLE)


def test_user_errors_are_not_retryable():
    assert not failure_is_retryable(Reason.EXIT_CODE)
    assert not failure_is_retryable(Reason.CANCELLED_BY_USER)
    assert not failure_is_retryable(Reason.COULD_NEVER_FIT)
