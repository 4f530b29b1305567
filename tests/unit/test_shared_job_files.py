"""Working directories and workers' logs in the state store (store.jobfiles, behind
control.workdirs.SharedWorkdirs and control.logs.SharedLogStore), on SQLite and PostgreSQL:
what one control-plane replica stores, another reads; a log grows only at its end, so two
replicas pulling the same bytes store them once; ended jobs' archives are collected; an
installation's older files stay readable."""

from __future__ import annotations

import threading

import pytest

from aicluster.control.logs import LogStore, SharedLogStore
from aicluster.control.workdirs import SharedWorkdirs
from aicluster.core.lifecycle import JobStatus, Reason
from aicluster.specs.job import JobSpec
from aicluster.store import open_store
from aicluster.store.jobfiles import JobFiles

from fakes import FakeClock


@pytest.fixture
def two_replicas(state_url):
    """Two stores on one database, as two control-plane processes would have."""
    clock = FakeClock()
    a, b = open_store(state_url, clock=clock), open_store(state_url, clock=clock)
    yield a, b
    a.close()
    b.close()


def test_a_workdir_stored_by_one_replica_is_launched_by_another(two_replicas, tmp_path):
    a, b = two_replicas
    blob = b"\x1f\x8b" + bytes(range(256)) * 4096  # ~1 MiB, binary
    ref = SharedWorkdirs(JobFiles(a)).put(blob)
    assert ref.startswith("db:")
    assert SharedWorkdirs(JobFiles(b)).get(ref) == blob
    with pytest.raises(FileNotFoundError, match="not in the state store"):
        SharedWorkdirs(JobFiles(b)).get("db:0000")
    # an archive an installation kept as a file before is still found
    legacy = tmp_path / "workdirs"
    legacy.mkdir()
    (legacy / "old.tar.gz").write_bytes(b"old")
    assert SharedWorkdirs(JobFiles(b), legacy).get("old.tar.gz") == b"old"


def test_the_archives_of_ended_jobs_are_collected(two_replicas):
    a, _ = two_replicas
    a.create_team("default")
    shared = SharedWorkdirs(JobFiles(a))
    spec = JobSpec(name="w", command="true")
    running = a.create_job(spec, "admin", shared.put(b"r"))
    ended = a.create_job(spec, "admin", shared.put(b"e"))
    assert a.transition(
        ended.id, JobStatus.PENDING, JobStatus.CANCELLED, Reason.CANCELLED_BY_USER, "no"
    )
    assert shared.collect() == 1 and shared.collect() == 0
    assert shared.get(running.workdir) == b"r"
    with pytest.raises(FileNotFoundError):
        shared.get(ended.workdir)


def test_logs_pulled_by_the_leader_are_read_by_every_replica(two_replicas):
    a, b = two_replicas
    leader, follower = SharedLogStore(JobFiles(a)), SharedLogStore(JobFiles(b))
    for chunk in (b"step 1\n", b"", b"step 2\n" * 3, b"done\n"):
        leader.append("j1", 1, 0, chunk)
    text = b"step 1\n" + b"step 2\n" * 3 + b"done\n"
    assert follower.offset("j1", 1, 0) == len(text)
    assert follower.read("j1", 1, 0) == text
    assert follower.read("j1", 1, 0, offset=10, limit=9) == text[10:19]  # across chunks
    assert follower.read("j1", 1, 0, offset=len(text)) == b""
    assert follower.read("j1", 1, 1) == b"" and follower.offset("j1", 2, 0) == 0
    assert follower.attempts("j1") == [1]


def test_two_replicas_appending_the_same_pull_store_it_once(two_replicas):
    a, b = two_replicas
    files_a, files_b = JobFiles(a), JobFiles(b)
    # both read the end (0), both pulled the worker's first bytes: the second stores none
    assert files_a.append_log("j", 1, 0, 0, b"hello ") == 6
    assert files_b.append_log("j", 1, 0, 0, b"hello ") == 0
    assert files_b.append_log("j", 1, 0, 3, b"lo ") == 0  # bytes the log has already
    assert files_b.append_log("j", 1, 0, 9, b"gap") == 0  # past the end: nothing
    SharedLogStore(files_b).append("j", 1, 0, b"world\n")  # no offset: at the end
    assert SharedLogStore(files_a).read("j", 1, 0) == b"hello world\n"


def test_a_stale_pull_stores_only_what_the_log_lacks(two_replicas):
    """A follower drains a cancelled job while the leader pulls: both read the end (0);
    the leader pulled one line, the follower two. Re-reading the end at append time would
    store the first line twice; appending at the offset pulled from stores each byte once."""
    a, b = two_replicas
    leader, follower = SharedLogStore(JobFiles(a)), SharedLogStore(JobFiles(b))
    worker = b"line 1\nline 2\nline 3\n"  # the worker's log file
    at_leader, at_follower = leader.offset("j", 1, 0), follower.offset("j", 1, 0)
    leader.append("j", 1, 0, worker[at_leader:7], at=at_leader)
    follower.append("j", 1, 0, worker[at_follower:14], at=at_follower)  # its new tail only
    assert leader.read("j", 1, 0) == worker[:14]
    leader.append("j", 1, 0, worker[7:14], at=7)  # the leader's next pull, now stale
    leader.append("j", 1, 0, worker[14:], at=14)
    assert follower.read("j", 1, 0) == worker and follower.offset("j", 1, 0) == len(worker)


def test_replicas_appending_one_pull_at_the_same_moment_store_it_once(state_url):
    """Four control-plane processes' stores, each in its own thread, released together
    with the same pull (the worker's bytes from the end they all read)."""
    clock = FakeClock()
    stores = [open_store(state_url, clock=clock) for _ in range(4)]
    logs = [SharedLogStore(JobFiles(s)) for s in stores]
    worker = b"".join(b"line %d\n" % i for i in range(200))
    try:
        for start in range(0, len(worker), 600):  # several pulls, each raced by all four
            gate = threading.Barrier(len(logs))

            def pull(replica: SharedLogStore, gate: threading.Barrier, end: int) -> None:
                at = replica.offset("j", 1, 0)
                gate.wait()
                replica.append("j", 1, 0, worker[at:end], at=at)

            args = [(r, gate, start + 600) for r in logs]
            threads = [threading.Thread(target=pull, args=a) for a in args]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            assert logs[0].read("j", 1, 0) == worker[: start + 600]
        assert logs[1].read("j", 1, 0) == worker
    finally:
        for s in stores:
            s.close()


def test_logs_of_an_older_installation_are_still_read(two_replicas, tmp_path):
    a, _ = two_replicas
    old = LogStore(tmp_path / "logs")
    old.append("j0", 1, 0, b"from before\n")
    logs = SharedLogStore(JobFiles(a), tmp_path / "logs")
    assert logs.read("j0", 1, 0) == b"from before\n" and logs.attempts("j0") == [1]
    logs.append("j2", 1, 0, b"new\n")
    assert logs.read("j2", 1, 0) == b"new\n"
