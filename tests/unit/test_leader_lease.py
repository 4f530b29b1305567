"""The leader lease (store.lease): acquisition, renewal, expiry, epochs, two contenders,
the fence on a stale writer's transaction and on the engine, and the elector thread. Every
test runs on a real SQLite file and on a real PostgreSQL database (tests/pgserver.py)."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest
from sqlalchemy import select

from aicluster.core.lifecycle import JobStatus, Reason
from aicluster.specs import load_spec_text
from aicluster.store import open_store
from aicluster.store.lease import (
    FencedEngine,
    LeaderElector,
    LeaderLease,
    StaleLeader,
    fenced,
    holder_is_dead,
    new_holder_id,
    replicas,
)
from aicluster.store.schema import EventRow

from harness import wait_for


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def store(state_url):
    st = open_store(state_url)
    st.create_team("ml")
    yield st
    st.close()


def _job(store, name="j"):
    spec = load_spec_text(f"kind: job\nname: {name}\nteam: ml\ncommand: x\n")
    return store.create_job(spec, "ann")


def _events(store, type_):
    with store._session() as s:
        return list(s.scalars(select(EventRow).where(EventRow.type == type_).order_by(EventRow.id)))


def test_acquire_renew_expire_and_epochs(store):
    clock = Clock()
    a = LeaderLease(store.engine, "a:1:x", ttl_s=3.0, clock=clock)
    b = LeaderLease(store.engine, "b:2:y", ttl_s=3.0, clock=clock)
    assert a.try_acquire() == 1
    assert b.try_acquire() is None  # held, unexpired
    clock.t += 2.0
    assert a.renew() and a.current().expires_at == pytest.approx(clock.t + 3.0)
    clock.t += 2.9
    assert b.try_acquire() is None  # the renewal moved the expiry on
    clock.t += 0.2
    assert b.try_acquire() == 2  # expired: a new epoch
    assert not a.renew() and a.epoch is None
    assert a.try_acquire() is None
    clock.t += 3.1
    assert a.try_acquire() == 3  # every acquisition increments the epoch
    assert [e.message.split(";")[0] for e in _events(store, "LeaderElected")] == [
        "epoch 1",
        "epoch 2",
        "epoch 3",
    ]
    lease = a.current()
    assert (lease.holder, lease.epoch) == ("a:1:x", 3)


def test_release_hands_over_at_once(store):
    clock = Clock()
    a = LeaderLease(store.engine, "a:1:x", clock=clock)
    b = LeaderLease(store.engine, "b:2:y", clock=clock)
    assert a.try_acquire() == 1
    a.release()
    assert b.try_acquire() == 2


def test_a_dead_holder_on_this_host_is_replaced_at_once(store):
    clock = Clock()
    a = LeaderLease(store.engine, "h:1:x", clock=clock)
    b = LeaderLease(store.engine, "h:2:y", clock=clock, is_dead=lambda h: h == "h:1:x")
    assert a.try_acquire() == 1
    assert b.try_acquire() == 2
    me = new_holder_id()
    host, _pid, rest = me.rsplit(":", 2)
    assert not holder_is_dead(me)
    assert not holder_is_dead(f"{host}:1:{rest}")  # pid 1 runs
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert holder_is_dead(f"{host}:{dead.pid}:{rest}")
    assert not holder_is_dead(f"{host}:{dead.pid}:x.1")  # another PID namespace: unknown
    assert not holder_is_dead(f"elsewhere:{dead.pid}:{rest}")


def test_two_contenders_exactly_one_wins(store):
    clock = Clock()
    for round_ in range(10):
        contenders = [LeaderLease(store.engine, f"c{i}:{round_}:z", clock=clock) for i in range(2)]
        won: list[int] = []
        barrier = threading.Barrier(2)

        def contend(lease, barrier=barrier, won=won):
            barrier.wait()
            epoch = lease.try_acquire()
            if epoch is not None:
                won.append(epoch)

        threads = [threading.Thread(target=contend, args=(c,)) for c in contenders]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert won == [round_ + 1]
        clock.t += 10  # expire it for the next round
    assert len(_events(store, "LeaderElected")) == 10


def test_stale_writer_is_rejected_inside_its_transaction(store):
    clock = Clock()
    a = LeaderLease(store.engine, "a:1:x", clock=clock)
    b = LeaderLease(store.engine, "b:2:y", clock=clock)
    job = _job(store)
    assert a.try_acquire() == 1
    with fenced(a):
        assert store.transition(job.id, JobStatus.PENDING, JobStatus.ADMITTED, Reason.ADMITTED)
    clock.t += 5  # a was paused past its lease; b takes over
    assert b.try_acquire() == 2
    before = len(store.list_events(object_id=job.id))
    with fenced(a, epoch=1), pytest.raises(StaleLeader):
        store.transition(job.id, JobStatus.ADMITTED, JobStatus.RUNNING, Reason.STARTED)
    assert store.get_job(job.id).status == JobStatus.ADMITTED  # rolled back, event too
    assert len(store.list_events(object_id=job.id)) == before
    assert a.rejected == 1
    # the new leader's writes, and unfenced writes (the API's), go through
    with fenced(b):
        assert store.transition(job.id, JobStatus.ADMITTED, JobStatus.RUNNING, Reason.STARTED)
    assert store.transition(
        job.id, JobStatus.RUNNING, JobStatus.CANCELLED, Reason.CANCELLED_BY_USER
    )


def test_an_expired_lease_fences_its_holder_even_before_a_takeover(store):
    clock = Clock()
    a = LeaderLease(store.engine, "a:1:x", ttl_s=3.0, clock=clock)
    job = _job(store)
    assert a.try_acquire() == 1
    clock.t += 3.5
    with fenced(a), pytest.raises(StaleLeader):
        store.transition(job.id, JobStatus.PENDING, JobStatus.ADMITTED, Reason.ADMITTED)
    assert store.get_job(job.id).status == JobStatus.PENDING


def test_fenced_engine_refuses_to_launch_or_stop_for_a_stale_leader(store):
    calls = []

    class Engine:
        def launch(self, req):
            calls.append(("launch", req))

        def stop(self, *a):
            calls.append(("stop", a))

        def nodes(self):
            return ["n1"]

    clock = Clock()
    a = LeaderLease(store.engine, "a:1:x", clock=clock)
    engine = FencedEngine(Engine(), a)
    with pytest.raises(StaleLeader):
        engine.launch("r0")  # not elected yet
    a.try_acquire()
    engine.launch("r1")
    engine.stop("j", 1, 1)
    clock.t += 10
    LeaderLease(store.engine, "b:2:y", clock=clock).try_acquire()
    with pytest.raises(StaleLeader):
        engine.launch("r2")
    with pytest.raises(StaleLeader):
        engine.stop("j", 1, 1)
    assert engine.nodes() == ["n1"]  # reads pass through
    assert calls == [("launch", "r1"), ("stop", ("j", 1, 1))]
    assert a.rejected == 3  # each refused action counted, as a refused commit is


def test_elector_elects_one_hands_over_on_release_and_writes_heartbeats(store):
    TTL = 5.0
    terms: dict[str, list] = {"a": [], "b": []}

    def elector(name):
        # a TTL long enough that a loaded machine never makes a miss a renewal
        lease = LeaderLease(store.engine, f"{name}:1:x", ttl_s=TTL)
        return LeaderElector(
            lease,
            renew_s=0.1,
            on_elected=lambda e: terms[name].append(("elected", e)),
            on_lost=lambda e, why: terms[name].append(("lost", e)),
            url=f"http://{name}",
        )

    a, b = elector("a"), elector("b")
    a.start()
    wait_for(lambda: a.leading is not None, timeout=10, what="a elected")
    b.start()
    wait_for(lambda: len(replicas(store.engine)) == 2, timeout=10, what="two heartbeats")
    assert b.leading is None
    rows = {r.holder: r for r in replicas(store.engine)}
    assert rows["a:1:x"].leading_epoch == 1 and rows["b:1:x"].leading_epoch is None
    started = time.monotonic()
    a.stop()  # a clean shutdown releases the lease
    wait_for(lambda: b.leading is not None, timeout=10, what="b elected")
    assert time.monotonic() - started < TTL  # no need to wait out the TTL
    b.stop()
    assert terms == {"a": [("elected", 1), ("lost", 1)], "b": [("elected", 2), ("lost", 2)]}
    assert replicas(store.engine) == []


def test_elector_gives_up_when_it_cannot_renew_in_time(store):
    lost = []
    lease = LeaderLease(store.engine, "a:1:x", ttl_s=0.5)
    el = LeaderElector(lease, renew_s=0.1, on_lost=lambda e, why: lost.append((e, why)))
    el.step()
    assert el.leading == 1
    el.valid_until = time.monotonic() - 0.01  # as if paused past the lease
    LeaderLease(store.engine, "b:2:y", ttl_s=0.5, is_dead=lambda h: True).try_acquire()
    el.step()
    assert lost and lost[0][0] == 1 and "expired" in lost[0][1]
    assert el.leading is None


def test_an_acquisition_waits_for_a_fenced_commit_in_flight(store):
    """PostgreSQL: the fence reads the lease FOR SHARE in the writer's transaction, so a
    takeover cannot slip between the check and the commit."""
    if store.backend != "postgresql":
        pytest.skip("SQLite has one writer at a time")
    a = LeaderLease(store.engine, "a:1:x", clock=Clock(1000.0))
    b = LeaderLease(store.engine, "b:2:y", clock=Clock(2000.0))  # b sees a's lease expired
    job = _job(store)
    assert a.try_acquire() == 1
    checked = threading.Event()
    holds = a.holds

    def slow_holds(conn=None, epoch=None):
        ok = holds(conn, epoch)
        checked.set()
        _until_another_waits_on_a_lock(store.engine)  # b, between this check and the commit
        return ok

    a.holds = slow_holds

    def writer():
        with fenced(a):
            store.transition(job.id, JobStatus.PENDING, JobStatus.ADMITTED, Reason.ADMITTED)

    t = threading.Thread(target=writer)
    t.start()
    assert checked.wait(10)
    assert b.try_acquire() == 2  # waits for a's commit, then takes over
    # a's commit landed before b's term began (the two threads' own bookkeeping after
    # the lock is released may come in either order: the database's is what counts)
    assert store.get_job(job.id).status == JobStatus.ADMITTED
    t.join()
    with fenced(a, epoch=1), pytest.raises(StaleLeader):
        store.transition(job.id, JobStatus.ADMITTED, JobStatus.RUNNING, Reason.STARTED)


def _until_another_waits_on_a_lock(engine, timeout: float = 10.0) -> None:
    """PostgreSQL: return once some other session of this database waits on a lock (or
    after `timeout`: the test's own assertions then say what went wrong)."""
    from sqlalchemy import text

    deadline = time.monotonic() + timeout
    with engine.connect() as conn:
        while time.monotonic() < deadline:
            waiting = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                )
            ).scalar()
            conn.rollback()
            if waiting:
                return
            time.sleep(0.01)


def test_the_engine_fence_checks_a_fenced_thread_at_its_own_epoch(store):
    class Engine:
        def stop(self, *a):
            return "stopped"

    clock = Clock()
    a = LeaderLease(store.engine, "a:1:x", clock=clock)
    engine = FencedEngine(Engine(), a)
    assert a.try_acquire() == 1
    clock.t += 10
    assert a.try_acquire() == 2  # a new term of the same replica
    assert engine.stop("j", 1, 1) == "stopped"
    with fenced(a, epoch=1), pytest.raises(StaleLeader):
        engine.stop("j", 1, 1)  # a loop thread of the earlier term


def test_a_takeover_during_the_leaders_event_horizon_does_not_deadlock(store):
    """PostgreSQL: the leader's event_horizon holds a SHARE lock on `events` until its
    fenced commit reads the lease; the new leader writes its event before it locks the
    lease row, so the two wait for each other in one order only."""
    if store.backend != "postgresql":
        pytest.skip("SQLite has one writer at a time")
    a = LeaderLease(store.engine, "a:1:x", clock=Clock(1000.0))
    b = LeaderLease(store.engine, "b:2:y", clock=Clock(2000.0))
    assert a.try_acquire() == 1
    in_hook, results = threading.Event(), {}
    holds = a.holds

    def slow_holds(conn=None, epoch=None):
        in_hook.set()
        _until_another_waits_on_a_lock(store.engine)  # b's acquisition, behind this one
        return holds(conn, epoch)

    a.holds = slow_holds

    def leader():
        with fenced(a):
            results["horizon"] = store.event_horizon()

    t = threading.Thread(target=leader)
    t.start()
    assert in_hook.wait(10)
    assert b.try_acquire() == 2
    t.join()
    assert results["horizon"] is not None  # the leader's transaction committed, not aborted
