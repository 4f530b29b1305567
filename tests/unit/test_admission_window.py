"""The admission step plans over each team's window (control.pending_jobs): the first
`depth` jobs of its queue by priority, then age. A cycle that admitted while a queue was cut
short is followed by another in the same tick; the jobs past a window are told so once;
the queue's pages list every pending job, the window's first."""

from __future__ import annotations

import random

import pytest

from aicluster.control.jobs_loop import Controller
from aicluster.control.logs import LogStore
from aicluster.control.pending_jobs import PendingJobs, queue_key
from aicluster.core.lifecycle import JobStatus, Reason
from aicluster.core.model import WaitKind
from aicluster.core.scheduler import get_policy
from aicluster.specs.job import JobSpec

from fakes import FakeClock, FakeEngine, node, open_test_store, refreshed, settle

P = JobStatus.PENDING


class Seen:
    """The default policy, counting the gangs each cycle was shown per team."""

    def __init__(self):
        self.policy, self.cycles = get_policy("fair"), []

    def plan(self, snapshot, clock):
        per_team: dict[str, int] = {}
        for g in snapshot.pending:
            per_team[g.team] = per_team.get(g.team, 0) + 1
        self.cycles.append(per_team)
        return self.policy.plan(snapshot, clock)


@pytest.fixture
def world(tmp_path, store_template):
    clock = FakeClock()
    store = open_test_store(tmp_path, clock, ("default", "owner"), store_template)
    engine = FakeEngine([node("n1", gpus=0, cpus=4), node("n2", gpus=0, cpus=4)])
    seen = Seen()
    ctrl = Controller(
        store,
        engine,
        LogStore(tmp_path / "logs"),
        tmp_path / "w",
        tmp_path,
        clock=clock,
        policy=seen,
    )
    ctrl.pending.depth = 2
    yield ctrl, store, engine, seen
    ctrl.close()
    store.close()


def _submit(store, name, team="default", priority=0, cpus=1) -> str:
    spec = {"name": name, "team": team, "command": "x", "priority": priority}
    spec["resources"] = {"cpus": cpus}
    return store.create_job(JobSpec.model_validate(spec), "admin").id


def _tick(ctrl):
    ctrl.tick()
    settle(ctrl)


def test_a_cut_short_queue_is_planned_again_in_the_same_tick_until_the_nodes_are_full(world):
    """The simulator's minimal case for issue 17's truncation: more jobs than the window,
    all fitting; every one starts in the first tick, each cycle shown at most 2 a team."""
    ctrl, store, engine, seen = world
    ids = [_submit(store, f"j{i}") for i in range(8)]  # 8 one-CPU jobs, 8 CPUs
    _tick(ctrl)
    assert {store.get_job(i).status for i in ids} == {JobStatus.ADMITTED}
    assert len(seen.cycles) == 4 and all(c == {"default": 2} for c in seen.cycles)
    assert len(engine.launched) == 8


def test_the_jobs_past_a_window_are_told_so_once_and_listed_after_it(world):
    ctrl, store, engine, seen = world
    big = [_submit(store, f"big{i}", cpus=4) for i in range(6)]  # one a node
    _tick(ctrl)
    jobs = {i: store.get_job(i) for i in big}
    assert sorted(j.status for j in jobs.values()).count(JobStatus.ADMITTED) == 2
    jobs = {i: j for i, j in jobs.items() if j.status == P}
    tail_reason = ctrl._tail_reason("default")
    window = sorted(jobs.values(), key=queue_key)[:2]
    for job in jobs.values():
        if job in window:
            assert job.wait_kind is not WaitKind.QUEUED_BEHIND or "first 2" not in job.message
        else:
            assert (job.message, job.wait_kind) == (tail_reason, WaitKind.QUEUED_BEHIND)
    # the queue: the window's waits in the cycle's order, then the tail, every job once
    assert [e.workload_id for e in ctrl.queue] == [j.id for j in window] + [
        j.id for j in sorted(jobs.values(), key=queue_key)[2:]
    ]
    last = sorted(jobs.values(), key=queue_key)[-1].id
    waits = len(store.list_events(object_id=last))
    _tick(ctrl)
    _tick(ctrl)
    assert len(store.list_events(object_id=last)) == waits  # said once, not every tick
    assert ctrl.queue[-1].reason == tail_reason and ctrl.queue[-1:][0] == ctrl.queue[-1]


def test_a_job_pushed_out_of_the_window_by_a_newcomer_is_told_it_waits_behind(world):
    ctrl, store, engine, seen = world
    _submit(store, "hog1", cpus=4)
    _submit(store, "hog2", cpus=4)
    _tick(ctrl)  # the nodes are full from now on
    a, b = _submit(store, "a"), _submit(store, "b")
    _tick(ctrl)
    assert store.get_job(a).wait_kind is not WaitKind.QUEUED_BEHIND
    pushed = max((store.get_job(a), store.get_job(b)), key=queue_key)
    urgent = _submit(store, "urgent", priority=5)
    _tick(ctrl)
    assert store.get_job(pushed.id).wait_kind is WaitKind.QUEUED_BEHIND
    assert [e.workload_id for e in ctrl.queue][-1] == pushed.id
    assert seen.cycles[-1] == {"default": 2}
    assert urgent in {e.workload_id for e in ctrl.queue[:2]}


def test_the_window_and_tails_stay_a_full_reads_under_random_changes(tmp_path, store_template):
    """Submissions (any priority, two teams), admissions, cancels and the loop's own waits,
    in random order: after each refresh the kept queues equal a full read's (fakes.refreshed
    checks the window and the tails), and every job pushed from a window into a tail is
    unsettled."""
    clock = FakeClock()
    store = open_test_store(tmp_path, clock, ("default", "owner"), store_template)
    pending = PendingJobs(store, resync_s=1e9, depth=3)
    rng = random.Random(7)
    for step in range(120):
        clock.advance(rng.choice([0, 0, 1]))
        kept = pending.jobs()
        op = rng.random()
        if op < 0.5 or not kept:
            _submit(store, f"s{step}", rng.choice(["default", "owner"]), rng.randint(0, 3))
        elif op < 0.7:
            job = rng.choice(kept)
            store.transition(job.id, P, JobStatus.ADMITTED, Reason.ADMITTED, placement=["n1"])
        elif op < 0.8:
            job = rng.choice(kept)
            store.transition(job.id, P, JobStatus.CANCELLED, Reason.CANCELLED_BY_USER)
        else:
            waits = [(j.id, f"w{step}", WaitKind.CAPACITY) for j in rng.sample(kept, 1)]
            store.set_wait_messages(waits, written=pending.written)
        before = {t: ids[: pending.depth] for t, ids in _queues(pending).items()}
        jobs = refreshed(pending)
        assert [(j.id, j.message) for j in jobs] == [
            (j.id, j.message) for j in store.list_jobs(statuses=[P], limit=None)
        ]
        for team, ids in _queues(pending).items():
            pushed = [i for i in before.get(team, []) if i in ids[pending.depth :]]
            assert set(pushed) <= pending.unsettled, (step, team)
        pending.unsettled.clear()
    store.close()


def _queues(pending) -> dict[str, list[str]]:
    window, _ = pending.window()
    out: dict[str, list[str]] = {}
    for j in window:
        out.setdefault(j.team, []).append(j.id)
    for team, keys in pending.tails():
        out[team] += [k[-1] for k in keys]
    return out
