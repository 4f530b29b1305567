"""Recovery phases (control.recovery): measured from the interruption, never overlapping,
replay estimated from the newest checkpoint saved during the interrupted attempt."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from aicluster.control.recovery import Checkpoint, newest_checkpoint, recovery
from aicluster.store.jobs import AttemptRecord


def attempt(n, admitted, started, ended=None, reason=None, interrupted=None) -> AttemptRecord:
    return AttemptRecord(n, ["n1"], admitted, started, ended, reason, interrupted)


def test_phases_run_from_the_interruption_to_running_again():
    lost = attempt(1, 100.0, 101.0, ended=162.5, reason="node_lost", interrupted=160.0)
    again = attempt(2, 163.0, None)
    r = recovery(lost, again, running_at=164.25)
    assert r.phases() == {
        "detection": pytest.approx(2.5),
        "queue": pytest.approx(0.5),
        "launch": pytest.approx(1.25),
        "replay": pytest.approx(59.0),  # no checkpoint: everything since its start
    }
    assert r.total_s == pytest.approx(4.25)
    assert r.sentence() == (
        "recovered 4.2 s after node_lost (detection 2.5 s, queue 0.5 s, launch 1.2 s); "
        "about 59.0 s of work since its start to redo"
    )


def test_replay_starts_at_the_newest_checkpoint_saved_during_the_attempt():
    lost = attempt(1, 100.0, 101.0, ended=162.5, reason="node_lost", interrupted=160.0)
    r = recovery(lost, attempt(2, 163.0, None), 164.0, Checkpoint(150.0, 1000))
    assert (r.replay_s, r.checkpoint_step) == (pytest.approx(10.0), 1000)
    assert r.sentence().endswith("about 10.0 s of work since checkpoint step 1000 to redo")
    # A checkpoint from an earlier attempt: this attempt's whole run is redone.
    r = recovery(lost, attempt(2, 163.0, None), 164.0, Checkpoint(90.0, 500))
    assert (r.replay_s, r.checkpoint_step) == (pytest.approx(59.0), None)


def test_a_stop_by_the_platform_is_its_own_interruption():
    drained = attempt(1, 100.0, 101.0, ended=130.0, reason="node_drained")
    r = recovery(drained, attempt(2, 131.0, None), 133.0)
    assert (r.detection_s, r.queue_s, r.launch_s) == (0.0, 1.0, 2.0)


def test_an_attempt_that_never_ran_has_nothing_to_replay_and_a_running_one_no_recovery():
    failed_launch = attempt(1, 100.0, None, ended=101.0, reason="launch_failed")
    r = recovery(failed_launch, attempt(2, 102.0, None), 103.0)
    assert r.replay_s is None and "to redo" not in r.sentence()
    assert recovery(attempt(1, 100.0, 101.0), attempt(2, 102.0, None), 103.0) is None


def test_newest_checkpoint_is_the_newest_saved_before_the_interruption():
    def version(at, step):
        return SimpleNamespace(created_at=at, metadata={"step": step} if step is not None else {})

    versions = [version(10.0, 100), version(30.0, 300), version(20.0, None)]
    assert newest_checkpoint(versions, before=25.0) == Checkpoint(20.0, None)
    assert newest_checkpoint(versions, before=35.0) == Checkpoint(30.0, 300)
    assert newest_checkpoint(versions, before=5.0) is None
    assert newest_checkpoint([version(1.0, "7")], before=5.0) == Checkpoint(1.0, None)
