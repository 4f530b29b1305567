"""A worker's start never follows a stop or a fencing status (runtime.worker): what lets
a control plane that takes over a dead one's launch redo it without the command running
twice (control.jobs_loop `_adopt`)."""

from __future__ import annotations

import threading

import pytest

from aicluster.engine.worker_actor import WorkerActor
from aicluster.runtime.worker import Fenced, WorkerProcess


def _worker(tmp_path, name="job") -> WorkerProcess:
    return WorkerProcess(name, 1, 0, scratch_root=str(tmp_path / "scratch"))


@pytest.mark.parametrize("how", ["fence", "stop"])
def test_a_start_after_a_fence_or_a_stop_is_refused_and_runs_nothing(tmp_path, how):
    w = _worker(tmp_path)
    marker = tmp_path / "ran"
    if how == "fence":
        assert w.status(0, fence=True)["started"] is False
    else:
        assert w.stop() is None
    with pytest.raises(Fenced, match="stopped before its command started"):
        w.start(f"touch {marker}", {}, None)
    assert w.proc is None and w.status(0)["started"] is False
    assert not marker.exists()


def test_a_fence_leaves_a_started_worker_running_and_a_plain_status_fences_nothing(tmp_path):
    w = _worker(tmp_path)
    assert w.status(0)["started"] is False  # a plain look: the start may still come
    pid = w.start("sleep 30", {}, None)
    st = w.status(0, fence=True)
    assert st["started"] is True and st["pid"] == pid and st["exit_code"] is None
    assert w.start("sleep 30", {}, None) == pid  # idempotent, fence or not
    assert w.stop(grace=0.5) is not None


class _SlowStart(WorkerProcess):
    """A start that pauses halfway (where a real one pulls its inputs) until told."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.halfway, self.go_on = threading.Event(), threading.Event()

    def _join_swarm(self, peers, inputs):
        self.halfway.set()
        assert self.go_on.wait(timeout=30)
        return super()._join_swarm(peers, inputs)


def test_a_fence_that_lands_halfway_through_a_start_stops_the_command_from_running(tmp_path):
    """The dead control plane's start is pulling inputs when the new one looks: the look
    says "not started", so the start must not run the command afterwards."""
    w = _SlowStart("job", 1, 0, scratch_root=str(tmp_path / "scratch"))
    marker = tmp_path / "ran"
    outcome: dict = {}

    def start():
        try:
            outcome["pid"] = w.start(f"touch {marker}", {}, None)
        except Fenced as exc:
            outcome["refused"] = str(exc)

    t = threading.Thread(target=start)
    t.start()
    assert w.halfway.wait(timeout=30)
    assert w.status(0, fence=True)["started"] is False
    w.go_on.set()
    t.join(timeout=30)
    assert outcome == {"refused": "this worker was stopped before its command started"}
    assert w.proc is None and not marker.exists()


def test_an_idle_pooled_actor_asked_with_a_fence_or_stopped_is_never_bound():
    for ask in (lambda a: a.status(0, fence=True), lambda a: a.stop()):
        actor = WorkerActor()  # idle: made for a node's pool, no rank yet
        answer = ask(actor)
        assert answer is None or answer["started"] is False
        assert actor.bind("job", 1, 0) is None  # a bind still on its way is refused


class _FencedInTheCluster(WorkerProcess):
    """A worker whose attempt a takeover fenced before this worker existed."""

    def _fenced_elsewhere(self) -> bool:
        return True


def test_a_worker_made_after_its_attempt_was_fenced_refuses_to_start(tmp_path):
    w = _FencedInTheCluster("job", 1, 0, scratch_root=str(tmp_path / "scratch"))
    marker = tmp_path / "ran"
    with pytest.raises(Fenced, match="attempt 1 of job was fenced by a takeover"):
        w.start(f"touch {marker}", {}, None)
    assert w.proc is None and w.status(0)["started"] is False and not marker.exists()
    with pytest.raises(Fenced):  # and stays refused
        w.start(f"touch {marker}", {}, None)
