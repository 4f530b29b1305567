"""The reconcile loop's batched writes and cached specs: `Store.transitions` (many jobs'
compare-and-set transitions, a few hundred per commit, each job's status with its event,
a stale leader's batch refused whole), control.admission.TransitionBatch (what follows a
transition runs once it is committed, in order), store.spec_cache (a spec parsed once
per job and stored text) and control.pending_jobs.PendingJobs (the waits the loop wrote are
not read back, yet equal a full read). The store tests run on a real SQLite file and on a real
PostgreSQL database (tests/pgserver.py)."""

from __future__ import annotations

import json

import pytest

from aicluster.control.active_jobs import ActiveJobs
from aicluster.control.admission import TransitionBatch
from aicluster.control.pending_jobs import PendingJobs
from aicluster.control.snapshot import job_workload
from aicluster.core.lifecycle import IllegalTransition, JobStatus, Reason, RequeueCause
from aicluster.core.model import WaitKind
from aicluster.specs import load_spec_text
from aicluster.store import open_store
from aicluster.store.jobs import Move
from aicluster.store.lease import LeaderLease, StaleLeader, fenced
from aicluster.store.spec_cache import SpecCache

from fakes import FakeClock, refreshed

P, A, R, S = JobStatus.PENDING, JobStatus.ADMITTED, JobStatus.RUNNING, JobStatus.SUCCEEDED


@pytest.fixture
def store(state_url):
    st = open_store(state_url, clock=FakeClock())
    st.create_team("ml")
    yield st
    st.close()


def _jobs(store, n: int) -> list:
    spec = "kind: job\nname: j{i}\nteam: ml\ncommand: x\nworkers: 2\n"
    return [store.create_job(load_spec_text(spec.format(i=i)), "ann") for i in range(n)]


def _admit(job, nodes=("n1", "n2")) -> Move:
    fields = dict(placement=list(nodes), attempt=job.attempt + 1)
    return Move(job.id, P, A, Reason.ADMITTED, "placed", fields=fields)


def _transitions(store, job_id: str) -> list[tuple]:
    return [
        (e.from_status, e.to_status, e.attempt, e.placement)
        for e in store.list_events(object_id=job_id)
        if e.type == "JobTransition"
    ]


def test_a_batch_moves_each_job_with_its_event_as_one_transition_would(store):
    jobs = _jobs(store, 7)
    store.transition(jobs[3].id, P, JobStatus.CANCELLED, Reason.CANCELLED_BY_USER)
    recs = store.transitions([_admit(j) for j in jobs], per_commit=3)  # three commits
    assert [r is None for r in recs] == [False, False, False, True, False, False, False]
    for job, rec in zip(jobs, recs):
        if rec is None:
            continue
        assert (rec.id, rec.status, rec.attempt, rec.placement) == (job.id, A, 1, ["n1", "n2"])
        assert rec.spec == job.spec and rec.wait_kind is None
        assert store.get_job(job.id) == rec
        assert _transitions(store, job.id) == [("PENDING", "ADMITTED", 1, ["n1", "n2"])]
    assert store.get_job(jobs[3].id).status == JobStatus.CANCELLED
    # the events in the order of the moves, after the submissions
    admitted = [e.object_id for e in store.list_events() if e.to_status == "ADMITTED"]
    assert admitted == [j.id for i, j in enumerate(jobs) if i != 3]
    # a mixed batch: starts and a success, with its exit code
    moves = [Move(jobs[0].id, A, R, Reason.STARTED), Move(jobs[1].id, A, R, Reason.STARTED)]
    store.transitions(moves)
    done = Move(jobs[0].id, R, S, Reason.COMPLETED, "ok", fields={"exit_code": 0})
    (rec,) = store.transitions([done])
    assert (rec.status, rec.exit_code, rec.message) == (S, 0, "ok")
    assert rec.finished_at is not None and rec.started_at is not None


def test_a_mixed_batch_moves_together_and_one_refused_move_leaves_no_half_of_it(store):
    """Moves that set different columns (admissions, starts, a success) go as grouped
    UPDATEs; when one job has left its `src` the batch is redone one move at a time: the
    others move exactly once, each with one event, and the one that left does not."""
    jobs = _jobs(store, 6)
    store.transitions([_admit(j) for j in jobs[:4]])
    store.transitions([Move(jobs[0].id, A, R, Reason.STARTED)])
    store.transition(jobs[3].id, A, JobStatus.CANCELLED, Reason.CANCELLED_BY_USER)
    for refused in (False, True):
        batch = [
            Move(jobs[0].id, R, S, Reason.COMPLETED, "ok", fields={"exit_code": 0}),
            Move(jobs[1].id, A, R, Reason.STARTED),
            Move(jobs[2].id, A, R, Reason.STARTED),
            _admit(jobs[4]),
        ]
        if refused:  # jobs[3] was cancelled: its start is refused, the rest still move
            batch = [Move(jobs[3].id, A, R, Reason.STARTED)] + [_admit(jobs[5])]
        recs = store.transitions(batch)
        moved = [r is not None for r in recs]
        assert moved == ([False, True] if refused else [True, True, True, True])
    got = {j.id: store.get_job(j.id).status for j in jobs}
    assert [got[j.id] for j in jobs] == [S, R, R, JobStatus.CANCELLED, A, A]
    assert _transitions(store, jobs[0].id) == [
        ("PENDING", "ADMITTED", 1, ["n1", "n2"]),
        ("ADMITTED", "RUNNING", 1, None),
        ("RUNNING", "SUCCEEDED", 1, None),
    ]
    assert _transitions(store, jobs[5].id) == [("PENDING", "ADMITTED", 1, ["n1", "n2"])]
    assert [e[:2] for e in _transitions(store, jobs[3].id)] == [
        ("PENDING", "ADMITTED"),
        ("ADMITTED", "CANCELLED"),
    ]


def test_a_job_moving_twice_in_one_batch_moves_in_order(store):
    (job,) = _jobs(store, 1)
    recs = store.transitions(
        [_admit(job), Move(job.id, A, R, Reason.STARTED), Move(job.id, A, R, Reason.STARTED)]
    )
    # both moves made, in order (the records are the job as the batch left it)
    assert [r.status if r else None for r in recs] == [R, R, None]
    assert [e[:2] for e in _transitions(store, job.id)] == [
        ("PENDING", "ADMITTED"),
        ("ADMITTED", "RUNNING"),
    ]


def test_a_batch_is_checked_before_anything_is_written(store):
    a, b = _jobs(store, 2)
    with pytest.raises(IllegalTransition):
        store.transitions([_admit(a), Move(b.id, P, S, Reason.COMPLETED)])
    assert [store.get_job(j.id).status for j in (a, b)] == [P, P]
    with pytest.raises(ValueError):
        store.transitions([_admit(a), Move(b.id, A, P, Reason.REQUEUED)])  # no cause
    assert store.get_job(a.id).status == P


def test_a_stale_leaders_batch_writes_nothing_and_the_new_leaders_does(store):
    now = [1000.0]
    a = LeaderLease(store.engine, "a:1:x", clock=lambda: now[0])
    b = LeaderLease(store.engine, "b:2:y", clock=lambda: now[0])
    jobs = _jobs(store, 5)
    assert a.try_acquire() == 1
    now[0] += 5  # a was paused past its lease; b takes over
    assert b.try_acquire() == 2
    with fenced(a, epoch=1), pytest.raises(StaleLeader):
        store.transitions([_admit(j) for j in jobs], per_commit=2)
    # the first commit was refused: nothing of it, and nothing after it, was written
    assert {store.get_job(j.id).status for j in jobs} == {P}
    assert all(_transitions(store, j.id) == [] for j in jobs)
    with fenced(b):
        assert all(store.transitions([_admit(j) for j in jobs], per_commit=2))
    assert {store.get_job(j.id).status for j in jobs} == {A}


def test_what_follows_a_transition_runs_after_the_commit_in_order(store):
    jobs = _jobs(store, 3)
    store.transition(jobs[1].id, P, JobStatus.CANCELLED, Reason.CANCELLED_BY_USER)
    seen = []

    def then(rec, job=None):
        # committed before: another connection reads it
        status = store.get_job(job.id).status
        seen.append((job.id, None if rec is None else rec.status, status))
        if job is jobs[0]:
            raise RuntimeError("one follow-up fails; the others still run")

    batch = TransitionBatch()
    for job in jobs:
        batch.add(_admit(job), lambda rec, job=job: then(rec, job))
    assert seen == []  # nothing written or run before `apply`
    assert store.get_job(jobs[0].id).status == P
    batch.apply(store)
    assert seen == [
        (jobs[0].id, A, A),
        (jobs[1].id, None, JobStatus.CANCELLED),
        (jobs[2].id, A, A),
    ]
    batch.apply(store)  # emptied: nothing again
    assert len(seen) == 3


def test_a_spec_is_parsed_once_per_job_and_stored_text():
    cache = SpecCache(size=16)
    text = json.dumps(
        load_spec_text("kind: job\nname: a\nteam: ml\ncommand: x\n").model_dump(mode="json")
    )
    first = cache.spec("a-1", text)
    assert cache.spec("a-1", text) is first  # the same text: not parsed again
    assert (cache.hits, cache.misses) == (1, 1)
    other = text.replace('"command": "x"', '"command": "y"')
    assert cache.spec("a-1", other).command == "y"  # new text under the same id: parsed
    assert cache.spec("a-2", text) == first and cache.misses == 3
    for i in range(40):  # bounded: the oldest go
        cache.spec(f"b-{i}", text)
    assert len(cache._specs) <= 16
    assert cache.spec("b-39", text) == first


def test_reads_share_the_parsed_spec_of_an_unchanged_job(store):
    (job,) = _jobs(store, 1)
    one, two = store.get_job(job.id), store.list_jobs(limit=None)[0]
    assert one.spec is two.spec and one.spec == job.spec
    assert store.get_jobs([job.id])[0].spec is one.spec


def test_a_refused_commit_stops_its_batch_but_what_committed_before_is_followed_up(store):
    now = [1000.0]
    a = LeaderLease(store.engine, "a:1:x", clock=lambda: now[0])
    jobs = _jobs(store, 4)
    assert a.try_acquire() == 1
    done: list[str] = []

    def then(rec):
        done.append(rec.id)
        if rec.id == jobs[1].id:  # the lease runs out after the first commit
            now[0] += 60

    batch = TransitionBatch()
    for job in jobs:
        batch.add(_admit(job), then)
    with fenced(a), pytest.raises(StaleLeader):
        batch.apply(store, per_commit=2)  # 2 + 2: the second commit is refused
    assert done == [jobs[0].id, jobs[1].id]
    assert [store.get_job(j.id).status for j in jobs] == [A, A, P, P]


class Reads:
    """The real store, counting the jobs that `get_jobs` is asked for."""

    def __init__(self, store):
        self.store, self.asked = store, []

    def get_jobs(self, ids):
        ids = list(ids)
        self.asked.append(sorted(ids))
        return self.store.get_jobs(ids)

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_the_waits_the_loop_wrote_are_not_read_back_yet_equal_a_full_read(store):
    reads = Reads(store)
    pending = PendingJobs(reads, resync_s=1e9)  # increments only, after the first read

    def full() -> list:
        return store.list_jobs(statuses=[P], limit=None)

    jobs = _jobs(store, 6)
    assert refreshed(pending) == full()
    store.clock.advance(5)
    waits = [(j.id, f"waits for {j.name}", WaitKind.CAPACITY) for j in jobs]
    assert store.set_wait_messages(waits, written=pending.written) == 6
    assert len(pending.written) == 6
    assert refreshed(pending) == full()  # message, kind and updated_at as written
    assert reads.asked == [[]] and pending.written == {}
    # the loop's write and another one to the same job: that job is read
    store.clock.advance(5)
    again = [(j.id, "waits for quota", WaitKind.QUOTA) for j in jobs[:3]]
    assert store.set_wait_messages(again, written=pending.written) == 3
    store.transition(jobs[0].id, P, JobStatus.CANCELLED, Reason.CANCELLED_BY_USER)
    store.set_wait_message(jobs[1].id, "an older replica's word", WaitKind.CAPACITY)
    assert refreshed(pending) == full() and len(full()) == 5
    assert reads.asked[-1] == sorted([jobs[0].id, jobs[1].id])
    # a view kept for a job whose wait changed is the view made anew
    views = pending.views(refreshed(pending), {})
    assert views == [job_workload(j) for j in full()]


def test_the_safety_net_check_repairs_a_change_made_without_an_event(store):
    """A write that bypassed the event log (here raw SQL: a bug, or a hand-edited
    database) is found by the periodic check, which compares ids and updated_at and reads
    only the jobs that differ, never the whole queue."""
    from sqlalchemy import text

    reads = Reads(store)
    clock = [0.0]
    pending = PendingJobs(reads, resync_s=60.0, clock=lambda: clock[0])
    jobs = _jobs(store, 5)
    first = refreshed(pending)
    assert first == store.list_jobs(statuses=[P], limit=None) and len(first) == 5
    with store.engine.begin() as conn:  # no event: the increments cannot see these
        conn.execute(
            text("UPDATE jobs SET message = 'edited', updated_at = updated_at + 1 WHERE id = :i"),
            {"i": jobs[1].id},
        )
        conn.execute(text("UPDATE jobs SET status = 'CANCELLED' WHERE id = :i"), {"i": jobs[2].id})
    store.create_job(load_spec_text("kind: job\nname: late\nteam: ml\ncommand: x\n"), "ann")
    clock[0] = 59.0
    stale = refreshed(pending)  # the late job's event is seen; the raw writes are not
    assert {j.id for j in stale} >= {jobs[2].id} and len(stale) == 6
    assert next(j for j in stale if j.id == jobs[1].id).message != "edited"
    clock[0] = 60.0
    asked = len(reads.asked)
    assert refreshed(pending) == store.list_jobs(statuses=[P], limit=None)
    assert reads.asked[asked:] == [sorted([jobs[1].id, jobs[2].id])]


def test_the_active_jobs_kept_across_refreshes_equal_a_full_read(store):
    """control.active_jobs: admissions, starts, successes, failures, requeues, cancels
    and waits of pending jobs in random order; after each refresh the kept jobs equal a
    full read of the ADMITTED and RUNNING ones, and only the jobs with a transition or
    already kept are read (a pending job's wait is not)."""
    import random

    reads = Reads(store)
    active = ActiveJobs(reads, resync_s=1e9)  # never resyncs: increments only
    rng = random.Random(3)
    _jobs(store, 30)
    assert active.refresh() == []
    for step in range(150):
        store.clock.advance(1)
        status = {j.id: j.status for j in store.list_jobs(limit=None)}

        def pick(st, status=status) -> list[str]:
            return [i for i, s in status.items() if s == st]

        op = rng.random()
        if op < 0.3 and pick(P):
            store.transitions([_admit(store.get_job(rng.choice(pick(P))))])
        elif op < 0.5 and pick(A):
            store.transition(rng.choice(pick(A)), A, R, Reason.STARTED)
        elif op < 0.6 and pick(R):
            store.transition(rng.choice(pick(R)), R, S, Reason.COMPLETED, exit_code=0)
        elif op < 0.7 and pick(R):
            store.transition(
                rng.choice(pick(R)),
                R,
                P,
                Reason.REQUEUED,
                "lost",
                requeue_cause=RequeueCause.WORKER_LOST,
            )
        elif op < 0.8 and pick(A):
            store.transition(rng.choice(pick(A)), A, JobStatus.CANCELLED, Reason.CANCELLED_BY_USER)
        elif pick(P):
            asked = len(reads.asked)
            store.set_wait_messages([(rng.choice(pick(P)), f"w{step}", WaitKind.CAPACITY)])
            assert active.refresh() == store.list_jobs(statuses=[A, R], limit=None)
            assert reads.asked[asked:] == [[]], "a pending job's wait is read"
        assert active.refresh() == store.list_jobs(statuses=[A, R], limit=None), step
        assert active.views() == [job_workload(j) for j in active._jobs.values()]


def test_the_active_jobs_safety_net_repairs_a_change_made_without_an_event(store):
    from sqlalchemy import text

    clock = [0.0]
    active = ActiveJobs(store, resync_s=60.0, clock=lambda: clock[0])
    jobs = _jobs(store, 3)
    store.transitions([_admit(j) for j in jobs])
    assert len(active.refresh()) == 3
    with store.engine.begin() as conn:  # no event: the increments cannot see it
        conn.execute(text("UPDATE jobs SET status = 'SUCCEEDED' WHERE id = :i"), {"i": jobs[0].id})
    clock[0] = 59.0
    assert len(active.refresh()) == 3  # not seen yet
    clock[0] = 60.0
    assert active.refresh() == store.list_jobs(statuses=[A, R], limit=None)
    assert len(active.jobs()) == 2


class Failing(Reads):
    """The real store, whose next `get_jobs` fails (it restarts between two reads)."""

    fail = False

    def get_jobs(self, ids):
        if self.fail:
            self.fail = False
            raise ConnectionError("the state store restarted")
        return super().get_jobs(ids)


@pytest.mark.parametrize("cache", ["pending", "active"])
def test_a_refresh_that_fails_halfway_loses_nothing(store, cache):
    """The store fails between reading the events and reading the jobs they name: the
    cache keeps what it had and its mark, and the next refresh catches up (a job dropped
    with the mark moved on would never be read again but by the 60 s safety net: an
    active job unreconciled for that long)."""
    reads = Failing(store)
    kept = PendingJobs(reads, resync_s=1e9) if cache == "pending" else ActiveJobs(reads, 1e9)
    jobs = _jobs(store, 4)
    store.transitions([_admit(j) for j in jobs[:2]])

    def full():
        statuses = [P] if cache == "pending" else [A, R]
        return store.list_jobs(statuses=statuses, limit=None)

    def now():
        kept.refresh()
        return kept.jobs()

    assert now() == full()
    store.transition(jobs[0].id, A, R, Reason.STARTED)  # active: one moves on
    store.transitions([_admit(jobs[2])])  # pending: one leaves
    before = kept.jobs()
    reads.fail = True
    with pytest.raises(ConnectionError):
        kept.refresh()
    assert kept.jobs() == before  # as it was, nothing dropped
    assert now() == full()


@pytest.mark.parametrize("cache", ["pending", "active"])
def test_a_store_that_lost_its_last_commits_is_read_whole_again(store, cache):
    """A database that crashes with asynchronous commits loses its newest commits and
    hands their event ids out again: events past the cache's mark would never be read.
    The newest event the cache read has gone, so it reads everything again (`rewound`)."""
    from sqlalchemy import text

    kept = PendingJobs(store, resync_s=1e9) if cache == "pending" else ActiveJobs(store, 1e9)
    jobs = _jobs(store, 4)
    store.transitions([_admit(j) for j in jobs[:2]])
    statuses = [P] if cache == "pending" else [A, R]
    kept.refresh()
    with store.engine.begin() as conn:
        top = conn.scalar(text("SELECT max(id) FROM events"))
    store.transition(jobs[0].id, A, R, Reason.STARTED)  # read, then lost in the crash
    store.transitions([_admit(jobs[2])])
    kept.refresh()
    with store.engine.begin() as conn:  # the crash: the last commits are gone
        conn.execute(text("DELETE FROM events WHERE id > :t"), {"t": top})
        conn.execute(text("UPDATE jobs SET status = 'ADMITTED' WHERE id = :i"), {"i": jobs[0].id})
        conn.execute(text("UPDATE jobs SET status = 'PENDING' WHERE id = :i"), {"i": jobs[2].id})
        if conn.dialect.name == "postgresql":  # the sequence goes back as well
            conn.execute(text("SELECT setval('events_id_seq', :t)"), {"t": top})
    store.transitions([_admit(jobs[3])])  # after the restart: an id the cache read before
    kept.refresh()
    assert kept.rewound
    assert kept.jobs() == store.list_jobs(statuses=statuses, limit=None)
    kept.refresh()
    assert not kept.rewound
