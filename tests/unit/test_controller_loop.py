"""The job reconcile loop (control.controller) over a fake engine, a fake clock and a
real SQLite store: admission onto nodes, exit codes, node loss and restarts,
preemption by quota, garbage collection, cancellation and per-attempt job tokens."""

from __future__ import annotations

import inspect
import json
import logging
import threading
from types import SimpleNamespace

import httpx
import pytest

from aicluster.api.app import create_app
from aicluster.control.api_ops import ApiOps
from aicluster.control.jobs_loop import GC_EVERY_S, NODE_DEATH_GRACE_S, Controller
from aicluster.control.logs import LogStore
from aicluster.control.metrics import Metrics
from aicluster.core.lifecycle import JobStatus, Reason, RequeueCause
from aicluster.core.model import Quota, WaitKind
from aicluster.engine.protocol import Engine, LaunchError
from aicluster.runtime import envs
from aicluster.specs.job import JobSpec
from aicluster.store.identity import Principal
from aicluster.store.quotas import QuotaStore

from asgi_server import serving
from fakes import FakeClock, FakeEngine, node, open_test_store, settle

ADMIN = Principal("admin", None, "admin")
P, A, R = JobStatus.PENDING, JobStatus.ADMITTED, JobStatus.RUNNING


class World:
    """One control plane's job side: store, fake engine (two 2-GPU nodes), controller."""

    def __init__(self, tmp_path, template, quotas: bool = False):
        self.clock = FakeClock()
        self.store = open_test_store(
            tmp_path, self.clock, ("default", "owner", "borrower"), template
        )
        self.engine = FakeEngine(
            [node("n1", gpus=2, cpus=4, pool="gpu"), node("n2", gpus=2, cpus=4, pool="gpu")]
        )
        self.logs = LogStore(tmp_path / "logs")
        self.quotas = QuotaStore(self.store) if quotas else None
        self.tmp = tmp_path
        self.ctrl = self.controller()

    def controller(self) -> Controller:
        return Controller(
            self.store,
            self.engine,
            self.logs,
            self.tmp / "workdirs",
            self.tmp,
            clock=self.clock,
            quotas=self.quotas,
            api_url="http://cp.test:8000",
        )

    def submit(self, name: str = "train", **spec) -> str:
        doc = JobSpec.model_validate({"name": name, "command": "python train.py", **spec})
        return self.store.create_job(doc, "admin").id

    def tick(self) -> None:
        """One pass, then let the launches it started finish."""
        self.ctrl.tick()
        settle(self.ctrl)

    def job(self, job_id: str):
        return self.store.get_job(job_id)

    def run(self, job_id: str):
        """Tick until the job runs (admitted, launched, seen started)."""
        for _ in range(3):
            self.tick()
            if self.job(job_id).status == R:
                return self.job(job_id)
        raise AssertionError(f"{job_id} is {self.job(job_id).status}: {self.job(job_id).message}")

    def statuses(self, job_id: str) -> list[str]:
        return [
            e.to_status
            for e in self.store.list_events(object_id=job_id)
            if e.type == "JobTransition" or e.type == "JobSubmitted"
        ]

    def close(self) -> None:
        self.ctrl.close()
        self.store.close()


@pytest.fixture
def world(tmp_path, store_template):
    w = World(tmp_path, store_template)
    yield w
    w.close()


@pytest.fixture
def quota_world(tmp_path, store_template):
    w = World(tmp_path, store_template, quotas=True)
    yield w
    w.close()


def test_the_fake_engine_has_every_method_of_the_engine_protocol():
    wanted = {n for n in vars(Engine) if not n.startswith("_")}
    assert wanted >= {"scan_output", "upload_output"}
    for name in wanted:
        proto = inspect.signature(getattr(Engine, name))
        fake = inspect.signature(getattr(FakeEngine, name))
        assert list(proto.parameters) == list(fake.parameters), name


# -- admission and the end of a job ----------------------------------------------------


def test_a_pending_gang_is_admitted_onto_nodes_that_fit_and_runs(world):
    job_id = world.submit(workers=2, resources={"cpus": 1, "gpus": 2})
    world.tick()
    job = world.job(job_id)
    assert job.status == A and job.attempt == 1
    assert sorted(job.placement) == ["n1", "n2"]  # 2 GPUs each: one worker per node
    (req,) = world.engine.launched
    assert (req.job_id, req.attempt, req.gpus) == (job_id, 1, 2)
    assert req.placement == tuple(job.placement)
    assert req.env["AICLUSTER_JOB_ID"] == job_id and req.env["AICLUSTER_ATTEMPT"] == "1"
    world.tick()
    assert world.job(job_id).status == R
    assert world.statuses(job_id) == ["PENDING", "ADMITTED", "RUNNING"]


def test_a_job_larger_than_the_cluster_waits_with_a_reason(world):
    job_id = world.submit(workers=3, resources={"gpus": 2})
    world.tick()
    job = world.job(job_id)
    assert job.status == P and job.message.startswith("could never fit")
    assert job.wait_kind is WaitKind.NEVER_FITS
    assert world.engine.launched == []


def test_workers_that_exit_0_end_the_job_succeeded_and_their_logs_are_kept(world):
    job_id = world.submit(workers=2, resources={"gpus": 2})
    world.run(job_id)
    world.engine.write(job_id, 0, b"epoch 1\n")
    world.tick()
    world.engine.exit(job_id, 0, log=b"done\n")
    world.tick()
    job = world.job(job_id)
    assert (job.status, job.reason, job.exit_code) == (JobStatus.SUCCEEDED, "completed", 0)
    assert world.logs.read(job_id, 1, 0) == b"epoch 1\ndone\n"
    assert world.logs.read(job_id, 1, 1) == b"done\n"
    assert (job_id, 1) in world.engine.stopped and not world.engine.running_gangs()


def test_a_running_ranks_log_end_is_read_from_the_store_once_not_every_tick(world):
    """At scale a tick must not ask the log store where each running rank's log ends
    (a query each, on the server's store); the loop keeps it (starting at 0 for an
    attempt it launched, read once for one it adopted), and a kept end that fell
    behind (bytes stored meanwhile by someone else) only costs a re-pull, never a gap or
    a byte twice."""
    asked = []
    offset = world.logs.offset

    def counted(*key):
        asked.append(key)
        return offset(*key)

    world.logs.offset = counted
    job_id = world.submit(workers=2, resources={"gpus": 2})
    world.run(job_id)
    for i in range(5):
        world.engine.write(job_id, 0, f"step {i}\n".encode())
        world.tick()
    # rank 1 printed nothing: a new attempt's log is empty, its end never asked (rank 0's
    # appends ask the file store themselves)
    assert asked.count((job_id, 1, 1)) == 0
    world.ctrl.close()
    world.ctrl = world.controller()  # the next leader reads where each log ends, once
    for _ in range(3):
        world.tick()
    assert asked.count((job_id, 1, 1)) == 1
    world.logs.append(job_id, 1, 1, b"from another leader\n", at=0)  # the kept end lags
    world.engine.write(job_id, 1, b"from another leader\nmore\n")
    world.tick()
    world.tick()
    assert world.logs.read(job_id, 1, 0) == b"".join(f"step {i}\n".encode() for i in range(5))
    assert world.logs.read(job_id, 1, 1) == b"from another leader\nmore\n"


ENV = {"pip": ["numpy==2.1.0"]}


def test_a_jobs_environment_goes_to_its_workers_and_its_build_shows_as_its_message(world):
    job_id = world.submit(workers=2, environment=ENV)
    world.run(job_id)
    env = world.engine.launched[-1].env
    assert json.loads(env[envs.SPEC_ENV]) == {"pip": ["numpy==2.1.0"], "remove": []}
    assert env[envs.ACTIVATE_ENV] == "1"
    world.engine.write(job_id, 1, b"aicluster env: building env k1 (pip: numpy==2.1.0) in /e\n")
    world.tick()
    assert (
        world.job(job_id).message
        == "environment (rank 1): building env k1 (pip: numpy==2.1.0) in /e"
    )
    world.clock.advance(0.5)  # within the throttle: pip's next line changes nothing stored
    world.engine.write(job_id, 1, b"aicluster env: building env k1: 3 packages collected\n")
    world.tick()
    assert world.job(job_id).message.endswith("in /e")
    world.clock.advance(5)
    world.engine.write(job_id, 1, b"aicluster env: building env k1: 9 packages collected\n")
    world.tick()
    assert (
        world.job(job_id).message == "environment (rank 1): building env k1: 9 packages collected"
    )
    world.engine.write(job_id, 1, b"aicluster env: ready env k1 built in 12.0 s: /e/k1\nhello\n")
    world.tick()
    assert world.job(job_id).message == "environment (rank 1): ready env k1 built in 12.0 s: /e/k1"
    events = [e for e in world.store.list_events(object_id=job_id) if e.type == "JobEnvironment"]
    assert [e.reason for e in events] == ["building", "ready"]  # one per phase
    world.engine.exit(job_id, 0)
    world.tick()
    assert world.job(job_id).status == JobStatus.SUCCEEDED


def test_an_environment_that_cannot_be_built_fails_the_job_with_pips_words(world):
    job_id = world.submit(environment=ENV, max_restarts=2)
    world.run(job_id)
    said = (
        b"aicluster env: building env k2 (pip: numpy==2.1.0) in /e\n"
        b"aicluster env: failed pip install failed (exit code 1):\n"
        b"ERROR: No matching distribution found for numpy==2.1.0\n"
    )
    world.engine.exit(job_id, 3, log=said)
    world.tick()
    job = world.job(job_id)
    assert (job.status, job.reason, job.restarts) == (JobStatus.FAILED, "environment_failed", 0)
    assert job.message.startswith("rank 0: pip install failed (exit code 1)")
    assert "No matching distribution found for numpy==2.1.0" in job.message


def test_a_command_exiting_3_without_an_environment_is_its_own_exit_code(world):
    job_id = world.submit()
    world.run(job_id)
    world.engine.exit(job_id, 3, log=b"aicluster env: failed not really\n")
    world.tick()
    assert world.job(job_id).reason == "exit_code"


def test_a_worker_exiting_non_zero_fails_the_job_with_its_exit_code(world):
    job_id = world.submit(workers=2, resources={"gpus": 2}, max_restarts=3)
    world.run(job_id)
    world.engine.exit(job_id, 3, ranks=[1], log=b"about to fail\n")
    world.tick()
    job = world.job(job_id)
    assert (job.status, job.reason, job.exit_code) == (JobStatus.FAILED, "exit_code", 3)
    assert job.message == "rank 1 exited with code 3" and job.restarts == 0  # a user error
    assert world.logs.read(job_id, 1, 1) == b"about to fail\n"
    assert not world.engine.running_gangs(), "rank 0 was still running: it is stopped too"
    assert world.statuses(job_id) == ["PENDING", "ADMITTED", "RUNNING", "FAILED"]


def test_a_launch_failure_is_retried_within_the_restart_budget(world):
    job_id = world.submit(max_restarts=1)
    world.engine.fail_launch[job_id] = "placement group not ready in time"
    world.tick()
    world.tick()  # the failed launch is seen: requeued, and admitted again at once
    job = world.job(job_id)
    assert job.restarts == 1 and job.attempt == 2
    requeue = [e for e in world.store.list_events(object_id=job_id) if e.reason == "requeued"]
    assert requeue[0].message.startswith("launch_failed: placement group not ready")
    assert job.requeue_cause is RequeueCause.LAUNCH_FAILED
    world.tick()
    job = world.job(job_id)
    assert (job.status, job.reason) == (JobStatus.FAILED, "launch_failed")


# -- node loss -------------------------------------------------------------------------


def test_a_lost_node_requeues_the_job_then_fails_it_node_lost_after_max_restarts(world):
    job_id = world.submit(resources={"gpus": 2}, max_restarts=1)
    first = world.run(job_id)
    world.engine.kill_node(first.placement[0])
    world.tick()
    job = world.job(job_id)
    requeue = [e for e in world.store.list_events(object_id=job_id) if e.reason == "requeued"]
    assert requeue and requeue[-1].message.startswith("node_lost: rank 0: node ")
    assert "restart 1 of 1" in requeue[-1].message
    assert job.restarts == 1 and job.attempt == 2, "requeued and placed again"
    assert job.placement != first.placement and (job_id, 1) in world.engine.stopped
    assert job.requeue_cause is RequeueCause.NODE_LOST
    second = world.run(job_id)
    assert second.requeue_cause is RequeueCause.NODE_LOST, "the latest requeue's, still"
    started = [e for e in world.store.list_events(object_id=job_id) if e.to_status == "RUNNING"]
    assert started[-1].message.startswith("recovered ") and "after node_lost" in started[-1].message
    world.engine.kill_node(second.placement[0])
    world.tick()
    job = world.job(job_id)
    assert (job.status, job.reason, job.restarts) == (JobStatus.FAILED, "node_lost", 1)


def test_a_vanished_worker_on_a_live_node_is_given_the_node_death_grace(world):
    job_id = world.submit(max_restarts=0)
    world.run(job_id)
    world.engine.lose(job_id, 0)
    world.tick()
    assert world.job(job_id).status == R, "its node may be dying: wait for Ray to say so"
    world.clock.advance(NODE_DEATH_GRACE_S + 1)
    world.tick()
    job = world.job(job_id)
    assert (job.status, job.reason) == (JobStatus.FAILED, "worker_lost")
    assert job.message == (
        "worker_lost: rank 0: worker process vanished; restarts exhausted (0 of 0)"
    )
    assert job.requeue_cause is None, "never requeued"


def test_a_vanished_worker_within_the_restart_budget_is_requeued_worker_lost(world):
    world.ctrl.metrics = Metrics()
    job_id = world.submit(max_restarts=1)
    world.run(job_id)
    world.clock.advance(7)
    world.tick()  # every worker answers: progress until now
    world.clock.advance(0.2)
    world.engine.lose(job_id, 0)
    world.tick()  # first seen lost: the node death grace starts now
    world.clock.advance(NODE_DEATH_GRACE_S + 1)
    world.tick()  # requeued, and admitted again at once
    job = world.job(job_id)
    assert (job.requeue_cause, job.restarts, job.attempt) == (RequeueCause.WORKER_LOST, 1, 2)
    world.clock.advance(2)
    world.run(job_id)
    # Measured from the last time the worker answered, not from the requeue.
    detection = 0.2 + NODE_DEATH_GRACE_S + 1
    assert world.job(job_id).message == (
        f"recovered {detection + 2:.1f} s after worker_lost (detection {detection:.1f} s, "
        "queue 0.0 s, launch 2.0 s); about 7.0 s of work since its start to redo"
    )
    first = world.store.job_attempts(job_id)[0]
    assert first.ended_at - first.interrupted_at == pytest.approx(detection)
    sample = world.ctrl.metrics.registry.get_sample_value
    assert sample("aicluster_job_recovery_seconds_count", {"cause": "worker_lost"}) == 1
    assert sample("aicluster_job_recovery_seconds_sum", {"cause": "worker_lost"}) == (
        pytest.approx(detection + 2)
    )
    phases = {"cause": "worker_lost", "phase": "replay"}
    assert sample("aicluster_job_recovery_phase_seconds_sum", phases) == pytest.approx(7)


def test_a_new_controller_adopts_a_gang_its_predecessor_launched(world):
    job_id = world.submit()
    world.tick()  # admitted and launched, then this control plane "dies"
    assert world.job(job_id).status == A
    world.ctrl.close()
    world.ctrl = world.controller()
    world.tick()
    assert world.job(job_id).status == R and len(world.engine.launched) == 1
    assert world.job(job_id).requeue_cause is None


class _Died(BaseException):
    """The control plane's process ending at this very point (kill -9)."""


@pytest.mark.parametrize("exit_code", [0, 3])
def test_a_control_plane_killed_while_stopping_a_finished_gang_leaves_the_job_ended(
    world, exit_code
):
    job_id = world.submit(workers=2, resources={"gpus": 2}, max_restarts=2)
    world.run(job_id)
    world.engine.exit(job_id, exit_code)
    stop = world.engine.stop

    def stop_then_die(*args, **kw):  # the workers are gone, then so is the control plane
        stop(*args, **kw)
        raise _Died()

    world.engine.stop = stop_then_die
    with pytest.raises(_Died):
        world.tick()
    world.engine.stop = stop
    world.ctrl = world.controller()
    for _ in range(3):
        world.clock.advance(NODE_DEATH_GRACE_S + 1)
        world.tick()
    job = world.job(job_id)
    want = JobStatus.SUCCEEDED if exit_code == 0 else JobStatus.FAILED
    assert (job.status, job.exit_code, job.restarts) == (want, exit_code, 0), job.message
    assert len(world.engine.launched) == 1, "it ran once: a finished job is never retried"


def test_a_launch_its_predecessor_left_unstarted_is_redone_control_plane_restarted(world):
    job_id = world.submit()
    world.engine.hold(job_id)  # the gang is launched, but its workers never come up
    world.tick()  # admitted and launched, then this control plane "dies"
    assert world.job(job_id).status == A
    world.ctrl.close()
    world.ctrl = world.controller()
    world.engine.release(job_id)
    world.tick()  # the orphan is looked at on the launch pool: the loop does not wait on it
    assert world.job(job_id).status == A and (job_id, 1) in world.engine.stopped
    # its look fenced the ranks: the dead launch's start, if still on its way, is refused
    assert world.engine.fenced == [(job_id, 1)]
    world.tick()  # and the next pass requeues it
    job = world.job(job_id)
    assert job.requeue_cause is RequeueCause.CONTROL_PLANE_RESTARTED and job.restarts == 0
    requeue = [e for e in world.store.list_events(object_id=job_id) if e.reason == "requeued"]
    assert requeue[-1].message == "control plane restarted during launch"
    job = world.run(job_id)
    assert job.attempt == 2 and "after control_plane_restarted (detection " in job.message


def test_a_paused_leaders_launch_that_comes_after_the_takeovers_look_never_runs(world):
    """The leader paused (SIGSTOP) before its launch had made any worker: the new term's
    look finds nothing, fences the attempt and redoes it; the old launch, let go after
    that, is refused, so the command runs in attempt 2 only."""
    job_id = world.submit()
    woken, launch = threading.Event(), world.engine.launch

    def paused_launch(req):  # attempt 1's launch is on its way, nothing made yet
        if req.attempt == 1:
            assert woken.wait(timeout=10), "the test never woke the paused leader"
        return launch(req)

    world.engine.launch = paused_launch
    paused = world.ctrl
    paused.tick()
    assert world.job(job_id).status == A and not world.engine.gangs
    world.ctrl = world.controller()  # the next term, while the old one is paused
    job = world.run(job_id)  # its look found nothing: fenced, stopped, redone
    assert world.engine.fenced == [(job_id, 1)] and (job_id, 1) in world.engine.stopped
    assert job.attempt == 2 and job.requeue_cause is RequeueCause.CONTROL_PLANE_RESTARTED
    woken.set()  # the paused leader wakes and its launch goes on
    with pytest.raises(LaunchError, match="fenced"):
        paused.launching[job_id].result(timeout=10)
    assert set(world.engine.gangs) == {(job_id, 2)}
    assert sorted(r.attempt for r in world.engine.launched) == [1, 2]
    paused.close()


def test_a_takeover_that_cannot_look_redoes_nothing_until_it_can(world):
    """A look that fails fenced nothing for sure: the attempt stays ADMITTED and is looked
    at again on a later pass, never redone blind."""
    job_id = world.submit()
    world.engine.hold(job_id)
    world.tick()
    world.ctrl.close()
    world.ctrl = world.controller()
    world.ctrl.adopt_retry_s = (0.0,)  # one try a pass
    looks = []
    status = world.engine.status

    def unreachable(*args, **kw):
        looks.append(kw.get("fence"))
        raise ConnectionError("the cluster's store is unreachable")

    world.engine.status = unreachable
    for _ in range(4):  # a pass finds the look failed, a later one looks again
        world.tick()
    assert world.job(job_id).status == A and world.engine.stopped == []
    assert len(looks) >= 2 and set(looks) == {True}
    world.engine.status = status
    world.engine.release(job_id)
    world.tick()
    world.tick()
    assert world.job(job_id).requeue_cause is RequeueCause.CONTROL_PLANE_RESTARTED


def test_a_new_term_admits_while_an_orphaned_launch_does_not_answer(world):
    """A gang admitted by a dead leader may take the engine's call timeout to answer; the
    new term's loop looks at it on the launch pool and admits other work meanwhile."""
    orphan = world.submit()
    world.engine.hold(orphan)
    world.tick()
    world.ctrl.close()
    world.ctrl = world.controller()  # the next term
    world.engine.status_gate.clear()  # the orphan's workers do not answer
    other = world.submit()
    world.ctrl.tick()
    assert world.job(orphan).status == A and world.job(other).status == A
    world.engine.status_gate.set()
    world.tick()
    world.tick()
    assert world.job(orphan).requeue_cause is RequeueCause.CONTROL_PLANE_RESTARTED
    assert world.job(other).status == R


# -- preemption --------------------------------------------------------------------------


def test_a_team_reclaiming_its_quota_preempts_a_borrower_without_spending_a_restart(
    quota_world, caplog
):
    caplog.set_level(logging.INFO, logger="aicluster.decisions")
    w = quota_world
    w.quotas.set(Quota("owner", "gpu", gpus=4, borrow_gpus=0))
    w.quotas.set(Quota("borrower", "gpu", gpus=0))
    borrower = w.submit("borrow", team="borrower", workers=2, resources={"gpus": 2})
    w.run(borrower)
    owner = w.submit("reclaim", team="owner", resources={"gpus": 2})
    for _ in range(3):
        w.tick()
    assert w.job(owner).status == R
    job = w.job(borrower)
    assert job.status == P and job.restarts == 0 and job.message, "waits, saying why"
    preempted = [
        e
        for e in w.store.list_events(object_id=borrower)
        if (e.message or "").startswith("preempted")
    ]
    assert preempted and ("owner" in preempted[0].message or "guarantee" in preempted[0].message)
    assert job.requeue_cause is RequeueCause.PREEMPTED
    assert (borrower, 1) in w.engine.stopped
    assert any(q[0] == borrower for q in w.ctrl.queue)
    (line,) = [r for r in caplog.records if getattr(r, "event", None) == "job_preempted"]
    assert line.name == "aicluster.decisions" and f"job={borrower} " in line.getMessage()
    assert line.fields["by"] == preempted[0].message.removeprefix("preempted: ")
    assert " by=" in line.getMessage() and line.fields["team"] == "borrower"
    w.engine.exit(owner, 0)
    w.run(borrower)
    assert w.job(borrower).attempt == 2, "back when the owner's job ended"


def _fragmented(w) -> dict[str, str]:
    """The borrower's one-GPU jobs on both 2-GPU nodes, one on each (within its guarantee
    of 2: nothing is borrowed, so preemption cannot help); node -> its job."""
    w.quotas.set(Quota("owner", "gpu", gpus=2))
    w.quotas.set(Quota("borrower", "gpu", gpus=2))
    jobs = [w.submit(f"small{i}", team="borrower", resources={"gpus": 1}) for i in range(4)]
    for job_id in jobs:
        w.run(job_id)
    by_node = {}
    for job_id in jobs:
        by_node.setdefault(w.job(job_id).placement[0], []).append(job_id)
    assert sorted(map(len, by_node.values())) == [2, 2]
    for node_jobs in by_node.values():  # one ends on each node: 1 GPU free on each
        w.engine.exit(node_jobs[0], 0)
    w.tick()
    return {n: js[1] for n, js in by_node.items()}


def _moved_for(w, owner: str, left: dict[str, str]) -> str:
    """The one job moved to give `owner` its node (it started again at once)."""
    assert w.job(owner).status == R
    moved = [j for j in left.values() if w.job(j).attempt == 2]
    assert len(moved) == 1, "one job moved, the other stayed"
    job = w.job(moved[0])
    assert job.status == R and job.restarts == 0
    assert job.placement[0] != w.job(owner).placement[0]
    events = [e.message or "" for e in w.store.list_events(object_id=moved[0])]
    assert any(m.startswith("preempted: moved to other nodes for") for m in events)
    return moved[0]


def test_a_guaranteed_gang_fragmented_out_is_given_a_node_by_moving_a_job(quota_world):
    """The owner's 2-GPU job needs a whole node: the control plane moves one of the
    borrower's jobs to the other node; it stops, starts again at once (attempt 2, no
    restart spent) and the owner runs."""
    w = quota_world
    left = _fragmented(w)
    owner = w.submit("big", team="owner", resources={"gpus": 2})
    for _ in range(4):
        w.tick()
    _moved_for(w, owner, left)


def test_work_that_ran_for_hours_moves_once_it_has_saved_a_checkpoint(quota_world):
    """Two hours in, the borrower's jobs would lose two hours each: nothing moves and
    the owner waits. Once they save a checkpoint (what the API records when a job's
    token commits one), moving one loses nothing much, and it moves."""
    w = quota_world
    left = _fragmented(w)
    w.clock.advance(2 * 3600.0)
    owner = w.submit("big", team="owner", resources={"gpus": 2})
    for _ in range(3):
        w.tick()
    assert w.job(owner).status == P
    assert all(w.job(j).attempt == 1 for j in left.values())
    for job_id in left.values():
        assert w.store.mark_checkpoint(job_id, w.clock(), "checkpoint saved")
    for _ in range(4):
        w.tick()
    _moved_for(w, owner, left)


def test_a_checkpoint_saved_through_the_api_tells_the_scheduler_what_a_stop_loses(world):
    """The job's own token commits a checkpoint with the SDK (runtime.checkpoint.save,
    real API routes on loopback): the job's record and its next running view carry the
    checkpoint's time (before, the scheduler counted everything since the start as lost
    work), and the job's events say it was saved."""
    from aicluster.api.artifacts_routes import artifact_router
    from aicluster.control.artifacts import ArtifactService
    from aicluster.control.snapshot import job_workload
    from aicluster.runtime import checkpoint
    from aicluster.store.artifacts import ArtifactStore

    job_id = world.submit("ckpt")
    world.run(job_id)
    assert world.job(job_id).last_checkpoint_at is None
    artifacts = ArtifactService(
        ArtifactStore.open(world.store, world.tmp / "home"),
        job_team=lambda jid: j.team if (j := world.store.get_job(jid)) else None,
        on_checkpoint=lambda job, v: world.store.mark_checkpoint(job, v.created_at, "saved"),
    )
    ops = ApiOps(world.store, world.engine, world.logs, world.tmp / "workdirs")
    job = world.job(job_id)
    env = {
        "AICLUSTER_TOKEN": world.store.create_job_token(job_id, job.attempt),
        "AICLUSTER_TEAM": job.team,
        "AICLUSTER_JOB_NAME": job.name,
        "AICLUSTER_JOB_ID": job_id,
    }
    (world.tmp / "state.txt").write_text("step 7\n")
    world.clock.advance(3600.0)
    with serving(create_app(ops, routers=[lambda p: artifact_router(artifacts, p)])) as url:
        env["AICLUSTER_URL"] = url
        checkpoint.save(world.tmp / "state.txt", step=7, env=env)
    saved = world.job(job_id).last_checkpoint_at
    assert saved is not None and saved >= job.started_at + 3600.0
    running = job_workload(world.job(job_id)).running("gpu")
    assert running.last_checkpoint_at == saved
    assert running.work_lost(saved + 60.0) == 60.0 * running.gang.total.gpus
    types = [e.type for e in world.store.list_events(object_id=job_id)]
    assert "JobCheckpointed" in types
    # only an active job is marked
    world.engine.exit(job_id, 0)
    world.tick()
    assert not world.store.mark_checkpoint(job_id, saved + 10.0, "late")


# -- garbage, cancellation, tokens ------------------------------------------------------


def test_garbage_collection_stops_gangs_no_live_attempt_owns(world):
    job_id = world.submit()
    world.run(job_id)
    world.engine.orphan("ghost-abc123", 1, ("n2",))  # no such job
    world.engine.orphan(job_id, 7, ("n2",))  # not the job's current attempt
    world.clock.advance(GC_EVERY_S)
    world.tick()
    assert world.engine.running_gangs() == {(job_id, 1)}
    assert {("ghost-abc123", 1), (job_id, 7)} <= set(world.engine.stopped)


def test_cancelling_a_running_job_stops_its_gang_and_keeps_its_logs(world):
    job_id = world.submit(workers=2, resources={"gpus": 2})
    world.run(job_id)
    world.engine.write(job_id, 1, b"last words\n")
    services = ApiOps(world.store, world.engine, world.logs, world.tmp / "workdirs")
    done = services.cancel(ADMIN, job_id)
    assert (done.status, done.reason) == (JobStatus.CANCELLED, "cancelled_by_user")
    assert not world.engine.running_gangs()
    assert world.logs.read(job_id, 1, 1) == b"last words\n"
    world.clock.advance(GC_EVERY_S)
    world.tick()
    assert world.job(job_id).status == JobStatus.CANCELLED and len(world.engine.launched) == 1


def test_a_gang_whose_launch_outlived_its_cancelled_job_is_collected(world):
    job_id = world.submit()
    world.engine.launch_gate.clear()  # the launch hangs in the engine ...
    world.ctrl.tick()
    ApiOps(world.store, world.engine, world.logs, world.tmp / "workdirs").cancel(ADMIN, job_id)
    world.engine.launch_gate.set()  # ... and completes after the job was cancelled
    settle(world.ctrl)
    assert world.engine.running_gangs() == {(job_id, 1)}
    world.clock.advance(GC_EVERY_S)
    world.tick()
    assert world.engine.running_gangs() == set()


def test_each_attempt_gets_a_job_token_that_dies_with_it(world):
    job_id = world.submit(max_restarts=1)
    first = world.run(job_id)
    token1 = world.engine.launched[-1].env["AICLUSTER_TOKEN"]
    assert world.engine.launched[-1].env["AICLUSTER_URL"] == "http://cp.test:8000"
    who = world.store.authenticate(token1)
    assert (who.job_id, who.team, who.is_admin) == (job_id, "default", False)
    world.engine.kill_node(first.placement[0])
    world.run(job_id)
    token2 = world.engine.launched[-1].env["AICLUSTER_TOKEN"]
    assert token2 != token1
    assert world.store.authenticate(token1) is None, "the first attempt's token is revoked"
    assert world.store.authenticate(token2).job_id == job_id
    world.engine.exit(job_id, 0)
    world.clock.advance(GC_EVERY_S)
    world.tick()
    assert world.job(job_id).status == JobStatus.SUCCEEDED
    assert world.store.authenticate(token2) is None
    assert world.store.revoke_job_tokens(job_id) == 0, "collected: no live token is left"


class FakeArtifacts:
    """The artifact store's upload API as the controller uses it: open an upload (the
    blobs storage lacks come back), commit it as the next version."""

    def __init__(self, have: set[str]):
        self.have, self.uploads, self.versions = have, {}, []
        self.artifacts = self

    def begin_upload(self, ref, kind, files, producer_job=None, created_by=None):
        up = SimpleNamespace(id=len(self.uploads) + 1, ref=ref, files=files, job=producer_job)
        self.uploads[up.id] = up
        return up, [f["sha256"] for f in files if f["sha256"] not in self.have]

    def commit(self, upload_id):
        up = self.uploads[upload_id]
        self.versions.append(up)
        return SimpleNamespace(team=up.ref.team, name=up.ref.name, version=len(self.versions))


def test_a_succeeded_jobs_outputs_are_uploaded_from_rank_0_and_committed(world):
    job_id = world.submit(outputs=[{"path": "out", "artifact": "weights"}])
    world.ctrl.artifacts = FakeArtifacts(have={"a" * 64})
    world.run(job_id)
    files = [
        {"path": "w.bin", "size": 10, "sha256": "a" * 64},
        {"path": "cfg.json", "size": 2, "sha256": "b" * 64},
    ]
    world.engine.outputs[(job_id, "out")] = files
    world.engine.exit(job_id, 0)
    world.tick()
    job = world.job(job_id)
    assert job.status == JobStatus.SUCCEEDED
    assert job.message == "all workers exited 0; produced default/weights:1"
    assert world.engine.uploaded == [(job_id, 1, "out", ["b" * 64])], "only what storage lacks"
    assert world.ctrl.artifacts.versions[0].job == job_id


def test_a_job_whose_outputs_cannot_be_stored_fails_output_failed(world):
    job_id = world.submit(outputs=[{"path": "out", "artifact": "weights"}])
    world.ctrl.artifacts = FakeArtifacts(have=set())
    world.run(job_id)
    world.engine.exit(job_id, 0)
    world.engine.scan_output = lambda *_a: (_ for _ in ()).throw(OSError("disk gone"))
    world.tick()
    job = world.job(job_id)
    assert (job.status, job.reason) == (JobStatus.FAILED, "output_failed")
    assert "disk gone" in job.message and not world.engine.running_gangs()


# -- the history of attempts and the operator's log ------------------------------------------


def _four_node_losses(world) -> str:
    """A job with max_restarts 3 whose node dies under each of its 4 attempts, 10 s in;
    a fresh node joins each time."""
    job_id = world.submit(resources={"gpus": 2}, max_restarts=3)
    for i in range(4):
        job = world.run(job_id)
        world.clock.advance(10)
        world.engine.kill_node(job.placement[0])
        world.engine.add_node(node(f"m{i}", gpus=2, cpus=4, pool="gpu"))
        world.tick()
    return job_id


def test_every_attempt_is_derived_from_the_events_and_the_last_says_restarts_ran_out(world):
    from aicluster.api.app import job_json

    job_id = _four_node_losses(world)
    job = world.job(job_id)
    assert (job.status, job.reason, job.restarts) == (JobStatus.FAILED, "node_lost", 3)
    assert job.message.startswith("node_lost: rank 0: node ")
    assert job.message.endswith("; restarts exhausted (3 of 3)")
    attempts = world.store.job_attempts(job_id)
    assert [a.attempt for a in attempts] == [1, 2, 3, 4]
    assert [a.end_reason for a in attempts] == ["node_lost"] * 4
    placements = [a.placement for a in attempts]
    assert all(len(p) == 1 for p in placements) and len({p[0] for p in placements}) == 4
    assert all(a.runtime_s(world.clock()) == 10 for a in attempts)
    assert all(a.admitted_at <= a.started_at < a.ended_at for a in attempts)
    body = job_json(job, world.store.list_events(object_id=job_id), attempts, world.clock())
    assert [a["attempt"] for a in body["attempts"]] == [1, 2, 3, 4]
    first = body["attempts"][0]
    assert set(first) >= {"attempt", "placement", "started_at", "ended_at", "runtime_s"}
    assert (first["runtime_s"], first["end_reason"]) == (10, "node_lost")
    assert first["placement"] == placements[0]
    assert "attempts" not in job_json(job), "only the one-job view reads them"


def test_attempts_end_with_their_requeue_cause_and_a_running_one_is_open(world):
    job_id = world.submit(max_restarts=1)
    world.engine.fail_launch[job_id] = "placement group not ready in time"
    world.tick()
    world.engine.fail_launch.pop(job_id)
    world.tick()  # requeued launch_failed, and admitted again
    world.run(job_id)
    world.clock.advance(5)
    first, second = world.store.job_attempts(job_id)
    assert (first.attempt, first.started_at, first.end_reason) == (1, None, "launch_failed")
    assert first.runtime_s(world.clock()) is None, "it never ran"
    assert (second.attempt, second.ended_at, second.end_reason) == (2, None, None)
    assert second.runtime_s(world.clock()) == 5
    assert second.placement == world.job(job_id).placement


def test_attempts_of_events_written_before_they_carried_attempts():
    from aicluster.store.jobs import EventRecord, attempts_of

    def ev(i, src, dst, reason, message=None):
        return EventRecord(
            i, float(i), "job", "j", None, "JobTransition", src, dst, reason, message, None
        )

    events = [
        ev(1, "PENDING", "ADMITTED", "admitted", "placed on n1"),
        ev(2, "ADMITTED", "RUNNING", "started"),
        ev(3, "RUNNING", "PENDING", "requeued", "preempted: team a reclaims its quota"),
        ev(4, "PENDING", "ADMITTED", "admitted", "placed on n2"),
        ev(5, "ADMITTED", "CANCELLED", "cancelled_by_user", "cancelled by ann"),
    ]
    a, b = attempts_of(events)
    assert (a.attempt, a.started_at, a.ended_at, a.end_reason) == (1, 2.0, 3.0, "preempted")
    assert (b.attempt, b.started_at, b.end_reason) == (2, None, "cancelled_by_user")


def test_the_operators_log_says_admitted_requeued_node_lost_and_failed(world, caplog):
    caplog.set_level(logging.INFO, logger="aicluster.decisions")
    world.tick()  # the first inventory: no node joins or dies yet
    job_id = _four_node_losses(world)
    mine = [r for r in caplog.records if r.name == "aicluster.decisions"]
    events = [r.event for r in mine]
    assert events.count("job_admitted") == 4 and events.count("job_requeued") == 3
    assert events.count("node_lost") == 4 and events.count("node_joined") == 4
    admitted = [r for r in mine if r.event == "job_admitted"]
    attempts = world.store.job_attempts(job_id)
    for rec, att in zip(admitted, attempts, strict=True):
        assert rec.getMessage() == (
            f"job_admitted job={job_id} team=default attempt={att.attempt} "
            f"placement={att.placement[0]} restarts={att.attempt - 1}"
        )
    requeued = [r for r in mine if r.event == "job_requeued"]
    assert all(r.fields["cause"] == "node_lost" for r in requeued)
    assert all(r.fields["detection_s"] >= 0 for r in requeued), "how long the loss took to see"
    assert "cause=node_lost" in requeued[0].getMessage()
    lost = [r for r in mine if r.event == "node_lost"]
    assert lost[0].levelno == logging.WARNING
    assert lost[0].getMessage() == f"node_lost node={attempts[0].placement[0]}"
    (failed,) = [r for r in mine if r.event == "job_failed"]
    assert failed.levelno == logging.WARNING and failed.fields["reason"] == "node_lost"
    line = failed.getMessage()
    assert line.startswith(f"job_failed job={job_id} team=default attempt=4 reason=node_lost")
    assert 'message="node_lost: rank 0: node ' in line and "restarts exhausted (3 of 3)" in line
    assert all("\n" not in r.getMessage() for r in mine), "one line each"


def test_the_nodes_route_shows_the_last_cycles_allocations_while_fresh(world):
    from aicluster.control.jobs_loop import ALLOCATIONS_MAX_AGE_S

    job_id = world.submit(resources={"gpus": 2})
    world.run(job_id)
    node_id = world.job(job_id).placement[0]
    token = world.store.create_token("admin")
    ops = ApiOps(
        world.store,
        world.engine,
        world.logs,
        world.tmp / "workdirs",
        allocated=world.ctrl.fresh_allocations,
    )

    def gpus_on_node() -> float:
        r = httpx.get(url + "/v1/nodes", headers={"Authorization": f"Bearer {token}"})
        r.raise_for_status()
        return {n["node_id"]: n for n in r.json()["nodes"]}[node_id]["allocated"]["gpus"]

    with serving(create_app(ops)) as url:
        assert gpus_on_node() == 2
        # the job ends behind the loop's back: the last cycle's view holds while fresh...
        world.store.transition(job_id, R, JobStatus.CANCELLED, Reason.CANCELLED_BY_USER)
        assert gpus_on_node() == 2
        # ...and once it is older, the route reads what runs now
        world.clock.advance(ALLOCATIONS_MAX_AGE_S + 1)
        assert world.ctrl.fresh_allocations() is None
        assert gpus_on_node() == 0
        world.tick()  # a new cycle: fresh again, and right
        assert world.ctrl.fresh_allocations() is not None and gpus_on_node() == 0
