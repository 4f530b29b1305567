"""What SQLite always allowed and PostgreSQL checks: the store's node, quota, service and
artifact-index operations, values at the limits the API accepts (64-bit quotas, 63-character
names), compare-and-set under two writers, and event ids read in commit order. Every test
runs on a real SQLite file and on a real PostgreSQL database (tests/pgserver.py)."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text

from aicluster.artifacts.manifest import FileEntry
from aicluster.core.lifecycle import JobStatus, Reason
from aicluster.core.model import Quota
from aicluster.core.nodestate import NodeState
from aicluster.core.replica import ReplicaReason, ReplicaStatus
from aicluster.specs import load_spec_text
from aicluster.specs.limits import INT64_MAX
from aicluster.specs.service import ServiceSpec
from aicluster.store import open_store
from aicluster.store.artifacts import ArtifactIndex
from aicluster.store.errors import Conflict
from aicluster.store.nodes import NodeStore
from aicluster.store.quotas import QuotaStore
from aicluster.store.schema import EventRow
from aicluster.store.services import ServiceStore

from fakes import FakeClock

LONG = "a" * 63  # the longest name the naming rule allows


@pytest.fixture
def store(state_url):
    st = open_store(state_url, clock=FakeClock())
    st.create_team("ml")
    st.create_team(LONG)
    st.create_user("ann", "ml", "member")
    yield st
    st.close()


def job_spec(name: str, team: str = "ml"):
    return load_spec_text(f"kind: job\nname: {name}\nteam: {team}\ncommand: x\n")


def test_the_longest_names_fit_every_column(store):
    job = store.create_job(job_spec(LONG, LONG), "ann")
    assert len(job.id) == 70
    store.transition(job.id, JobStatus.PENDING, JobStatus.ADMITTED, Reason.ADMITTED)
    assert [e.object_id for e in store.list_events(object_id=job.id)] == [job.id, job.id]
    svc = ServiceStore(store).create(ServiceSpec(name=LONG, team=LONG, model="m"), "ann")
    replica = ServiceStore(store).add_replica(svc)
    assert store.list_events(object_id=replica.id)[0].to_status == "PENDING"


def test_quotas_take_any_figure_the_api_accepts(store):
    q = Quota("ml", "gpu", INT64_MAX, INT64_MAX, INT64_MAX, 1e15, INT64_MAX, 2.5, "c")
    QuotaStore(store).set(q, actor="root")
    assert QuotaStore(store).all() == [q]
    QuotaStore(store).set(Quota("ml", "gpu", 2))  # the same key again replaces it
    assert QuotaStore(store).all() == [Quota("ml", "gpu", 2)]


def test_node_states_incarnations_and_their_events(store):
    nodes = NodeStore(store)
    nodes.observe("n1", "host-1", NodeState.READY, machine_id="m1")
    nodes.set_state("n1", NodeState.CORDONED, "disk", actor="root")
    nodes.set_state("n1", NodeState.DOWN, "lost")
    nodes.record_checks("n1", [{"name": "gpu", "ok": True}])
    old, new = nodes.supersede("n1", "n2", "host-1", "m1", NodeState.READY, None)
    assert (old.state, old.superseded_by, new.incarnations) == (NodeState.RETIRED, "n2", 2)
    assert nodes.get("n1").checks == [{"name": "gpu", "ok": True}]
    assert nodes.state_before_down("n1", ["n1"]) == (NodeState.CORDONED, "disk")
    assert set(nodes.all()) == {"n1", "n2"}


def test_replica_compare_and_set_lets_one_writer_win(store, state_url):
    services = ServiceStore(store)
    svc = services.create(ServiceSpec(name="llm", team="ml", model="m"), "ann")
    rep = services.add_replica(svc)
    other = open_store(state_url)
    try:
        won = services.transition(
            rep.id, ReplicaStatus.PENDING, ReplicaStatus.STARTING, ReplicaReason.PLACED
        )
        lost = ServiceStore(other).transition(
            rep.id, ReplicaStatus.PENDING, ReplicaStatus.STOPPED, ReplicaReason.DELETED
        )
    finally:
        other.close()
    assert won is not None and lost is None
    services.update(svc.seq, actor="ann", manual_replicas=3, deleting=True)
    assert services.get("ml", "llm").deleting is True
    services.remove(svc.seq)
    assert services.list() == [] and services.replicas(live_only=False) == []


def _commit(index: ArtifactIndex, name: str, version: int | None = None, tag: str | None = None):
    up = index.create_upload(
        "ml", name, "model", (FileEntry("f", 3, "0" * 64),), version=version, tag=tag
    )
    return index.commit_upload(up.id, lambda _up, _v, _t: "1" * 64)


def test_artifact_index_versions_tags_shares_and_proofs(store):
    index = ArtifactIndex(store)
    assert _commit(index, "m").version == 1
    assert _commit(index, "m", tag="stable").version == 2
    assert _commit(index, "m", version=7).version == 7
    with pytest.raises(Conflict):
        _commit(index, "m", version=3)
    assert index.resolve("ml", "m", None).version == 7
    assert index.resolve("ml", "m", "stable").version == 2
    index.set_share("ml", "m", LONG, True)
    assert index.is_shared_with("ml", "m", LONG)
    assert [a.name for a in index.list_artifacts(LONG)] == ["m"]
    assert index.delete_version("ml", "m", 7)
    assert _commit(index, "m").version == 8  # numbers are never reused
    index.add_proofs("ml", ["a" * 64, "b" * 64])
    index.add_proofs("ml", ["a" * 64])  # idempotent
    assert index.proved("ml", ["a" * 64, "c" * 64]) == {"a" * 64}


def test_concurrent_commits_of_one_name_get_distinct_versions(store):
    index = ArtifactIndex(store)
    got, errors = [], []

    def push():
        try:
            for _ in range(5):
                got.append(_commit(index, "same").version)
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=push) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(got) == list(range(1, 16))


def test_a_cursor_over_event_ids_never_skips_a_late_commit(store, state_url):
    """An event whose id was taken first but committed last is still read by a follower
    that has seen the ids after it (PostgreSQL hands out ids before commit; SQLite has one
    writer at a time, so its ids commit in order)."""
    if store.backend == "sqlite":
        pytest.skip("SQLite has one writer: a second transaction cannot take an id meanwhile")
    slow = store.engine.connect()
    tx = slow.begin()
    slow.execute(
        EventRow.__table__.insert().values(
            ts=1.0, kind="job", object_id="slow", team="ml", type="Late"
        )
    )  # an id taken, not yet committed
    store.add_event("job", "fast", "ml", "Early")  # a later id, committed first
    seen: list[list[str]] = []
    follower = threading.Thread(
        target=lambda: seen.append([e.object_id for e in store.list_events(after=0)])
    )
    follower.start()
    _wait_for_a_lock_wait(store)  # the follower waits for the open transaction
    tx.commit()
    slow.close()
    follower.join()
    ids = seen[0]
    assert "fast" not in ids or "slow" in ids  # never the later id without the earlier


def _wait_for_a_lock_wait(store) -> None:
    with store.engine.connect() as conn:
        for _ in range(2000):
            waiting = conn.execute(
                text("SELECT count(*) FROM pg_locks WHERE NOT granted AND relation IS NOT NULL")
            ).scalar()
            if waiting:
                return
            conn.execute(text("SELECT pg_sleep(0.005)"))
    raise AssertionError("the follower never waited for the open transaction")
