"""The state store: teams, users, tokens, jobs with compare-and-set transitions, and the
event log. Every test runs on a real SQLite file under tmp_path and on a real PostgreSQL
database (tests/pgserver.py), with a fake clock."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from aicluster.core.lifecycle import IllegalTransition, JobStatus, Reason, RequeueCause
from aicluster.core.model import WaitKind
from aicluster.specs import load_spec_text
from aicluster.specs.job import JobSpec
from aicluster.store import open_store
from aicluster.store.db import state_url as resolve_url
from aicluster.store.errors import Conflict, NotFound
from aicluster.store.identity import Principal

P, A, R = JobStatus.PENDING, JobStatus.ADMITTED, JobStatus.RUNNING
S, F, C = JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED


class FakeClock:
    """A clock that only moves when the test says so."""

    def __init__(self, now: float = 1_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def db_path(state_url):
    """The store's location: a SQLite file's URL or a PostgreSQL database's."""
    return state_url


@pytest.fixture
def store(db_path, clock):
    st = open_store(db_path, clock=clock)
    yield st
    st.close()


@pytest.fixture
def ml(store):
    """A store with team 'ml' and its member 'ann'."""
    store.create_team("ml")
    store.create_user("ann", "ml", "member")
    return store


def spec(name="train", team="ml", workers=2, priority=0) -> JobSpec:
    text = f"kind: job\nname: {name}\nteam: {team}\nworkers: {workers}\ncommand: x\npriority: {priority}\n"
    return load_spec_text(text)


def sql(db_path, statement: str, **params) -> list:
    """Run one statement on the store's database from outside the store (its rows)."""
    engine = create_engine(resolve_url(db_path))
    try:
        with engine.begin() as con:
            res = con.execute(text(statement), params)
            return res.fetchall() if res.returns_rows else []
    finally:
        engine.dispose()


def raw_rows(db_path, table):
    return sql(db_path, f"SELECT * FROM {table}")


def table_names(db_path) -> list[str]:
    engine = create_engine(resolve_url(db_path))
    try:
        return inspect(engine).get_table_names()
    finally:
        engine.dispose()


# -- teams and users ---------------------------------------------------------------


def test_create_and_list_teams(store, clock):
    store.create_team("vision", actor="root")
    store.create_team("ml")
    assert store.list_teams() == ["ml", "vision"]
    assert store.team_exists("ml")
    assert not store.team_exists("nlp")
    (ev, _) = store.list_events()
    assert (ev.kind, ev.object_id, ev.team, ev.type, ev.actor) == (
        "team",
        "vision",
        "vision",
        "TeamCreated",
        "root",
    )
    assert ev.ts == clock.now


def test_duplicate_team_conflicts(store):
    store.create_team("ml")
    with pytest.raises(Conflict):
        store.create_team("ml")
    assert store.list_teams() == ["ml"]
    assert len(store.list_events()) == 1


def test_ensure_team_is_idempotent(store):
    store.ensure_team("ml")
    store.ensure_team("ml")
    assert store.list_teams() == ["ml"]


def test_users(store):
    store.create_team("ml")
    assert not store.has_admin()
    store.create_user("root", None, "admin")
    store.create_user("ann", "ml", "member")
    assert store.has_admin()
    assert store.get_user("ann") == Principal("ann", "ml", "member")
    assert store.get_user("root").is_admin
    assert not store.get_user("ann").is_admin
    assert store.get_user("nobody") is None


def test_duplicate_user_conflicts(ml):
    with pytest.raises(Conflict):
        ml.create_user("ann", "ml", "viewer")
    assert ml.get_user("ann").role == "member"


def test_user_in_unknown_team_is_not_found(store):
    with pytest.raises(NotFound):
        store.create_user("bob", "ghosts", "member")
    assert store.get_user("bob") is None


# -- tokens ------------------------------------------------------------------------


def test_token_plaintext_is_returned_once_and_authenticates(ml):
    token = ml.create_token("ann")
    assert token.startswith("aic_")
    assert len(token) > 30
    assert ml.authenticate(token) == Principal("ann", "ml", "member")


def test_tokens_are_unique(ml):
    assert ml.create_token("ann") != ml.create_token("ann")


def test_only_the_sha256_digest_is_stored(ml, db_path):
    token = ml.create_token("ann")
    rows = raw_rows(db_path, "tokens")
    assert len(rows) == 1
    expected = hashlib.sha256(token.encode()).hexdigest()
    assert expected in rows[0]
    names = table_names(db_path)
    assert "tokens" in names
    for table in names:
        for row in raw_rows(db_path, table):
            for cell in row:
                assert token not in str(cell), (table, row)
    if db_path.startswith("sqlite"):  # nor in the bytes SQLite wrote (file and its log)
        for f in Path(db_path.split("///", 1)[1]).parent.iterdir():
            assert token.encode() not in f.read_bytes(), f.name


def test_bad_tokens_do_not_authenticate(ml):
    token = ml.create_token("ann")
    assert ml.authenticate("aic_not-a-token") is None
    assert ml.authenticate("") is None
    assert ml.authenticate(token[:-1]) is None
    assert ml.authenticate(token + "x") is None
    assert ml.authenticate(hashlib.sha256(token.encode()).hexdigest()) is None


def test_revoked_token_does_not_authenticate(ml, db_path):
    # The store has no revoke call yet; flip the column the way one would.
    keep, drop = ml.create_token("ann"), ml.create_token("ann")
    sql(
        db_path,
        "UPDATE tokens SET revoked = :yes WHERE digest = :digest",
        yes=True,
        digest=hashlib.sha256(drop.encode()).hexdigest(),
    )
    assert ml.authenticate(drop) is None
    assert ml.authenticate(keep) == Principal("ann", "ml", "member")


def test_token_for_unknown_user_is_not_found(store):
    with pytest.raises(NotFound):
        store.create_token("ghost")


# -- jobs --------------------------------------------------------------------------


def test_create_job_is_pending_with_a_submitted_event(ml, clock):
    s = spec()
    job = ml.create_job(s, owner="ann", workdir="wd-1234.tar.gz")
    assert job.status is P
    assert job.reason == "submitted"
    assert job.name == "train" and job.team == "ml" and job.owner == "ann"
    assert job.id.startswith("train-")
    assert job.spec == s
    assert job.workdir == "wd-1234.tar.gz"
    assert (job.restarts, job.attempt, job.priority) == (0, 0, 0)
    assert job.created_at == job.updated_at == clock.now
    assert job.started_at is None and job.finished_at is None
    assert ml.get_job(job.id) == job

    events = ml.list_events(object_id=job.id)
    assert len(events) == 1
    ev = events[0]
    assert (ev.kind, ev.type, ev.team) == ("job", "JobSubmitted", "ml")
    assert (ev.from_status, ev.to_status, ev.reason) == (None, "PENDING", "submitted")
    assert ev.message == "2 worker(s)"
    assert ev.actor == "ann"


def test_create_job_without_workdir(ml):
    job = ml.create_job(spec(), "ann")
    assert job.workdir is None
    assert ml.get_job(job.id).workdir is None


def test_the_spec_is_stored_as_json_and_read_back_typed(ml, db_path):
    s = load_spec_text(
        "kind: job\nname: train\nteam: ml\ncommand: [python, t.py]\n"
        "resources: {gpus: 2, memory: 1Gi}\nmax_restarts: 3\n"
        "outputs: [{path: out, artifact: weights}]\n"
    )
    job = ml.create_job(s, "ann")
    assert isinstance(job.spec, JobSpec) and job.spec == s
    assert job.spec.resources.gpus == 2 and job.spec.resources.memory == 2**30
    assert job.spec.outputs[0].kind == "model"
    ((column,),) = sql(db_path, "SELECT spec FROM jobs WHERE id = :id", id=job.id)
    assert (json.loads(column) if isinstance(column, str) else column) == s.model_dump(mode="json")


def test_a_spec_written_before_reads_back_with_its_defaults(ml, db_path):
    """A row whose JSON lacks fields with defaults (written by an older control plane)."""
    job = ml.create_job(spec(), "ann")
    old = {"kind": "job", "name": "train", "team": "ml", "workers": 2, "command": "x"}
    sql(db_path, "UPDATE jobs SET spec = :spec WHERE id = :id", spec=json.dumps(old), id=job.id)
    back = ml.get_job(job.id).spec
    assert back.workers == 2 and back.max_restarts == 0 and back.resources.cpus == 1.0
    assert back.inputs == [] and back.outputs == [] and back.max_pending_seconds is None


def test_create_job_takes_priority_from_spec(ml):
    assert ml.create_job(spec(priority=7), "ann").priority == 7


def test_create_job_in_unknown_team_is_not_found(ml):
    with pytest.raises(NotFound):
        ml.create_job(spec(team="ghosts"), "ann")
    assert ml.list_jobs() == []


def test_get_unknown_job_is_none(ml):
    assert ml.get_job("nope-000000") is None


def test_jobs_with_the_same_name_get_distinct_ids(ml):
    ids = {ml.create_job(spec(), "ann").id for _ in range(5)}
    assert len(ids) == 5


# -- transitions -------------------------------------------------------------------


def test_legal_transition_writes_record_and_event(ml, clock):
    job = ml.create_job(spec(), "ann")
    clock.advance(5)
    rec = ml.transition(
        job.id, P, A, Reason.ADMITTED, "placed", actor="scheduler", placement=["n1", "n2"]
    )
    assert rec.status is A
    assert rec.reason == "admitted"
    assert rec.message == "placed"
    assert rec.placement == ["n1", "n2"]
    assert rec.updated_at == clock.now
    assert rec.created_at == clock.now - 5
    assert ml.get_job(job.id) == rec

    ev = ml.list_events(object_id=job.id)[-1]
    assert ev.type == "JobTransition"
    assert (ev.from_status, ev.to_status) == ("PENDING", "ADMITTED")
    assert (ev.reason, ev.message, ev.actor) == ("admitted", "placed", "scheduler")
    assert ev.team == "ml"
    assert ev.ts == clock.now


def test_transition_from_the_wrong_status_returns_none_and_writes_nothing(ml):
    job = ml.create_job(spec(), "ann")
    before = ml.list_events()
    # Legal pair, but the job is PENDING, not ADMITTED.
    assert ml.transition(job.id, A, R, Reason.STARTED) is None
    assert ml.transition(job.id, R, S, Reason.COMPLETED) is None
    assert ml.get_job(job.id) == job
    assert ml.list_events() == before


def test_transition_of_unknown_job_returns_none(ml):
    before = ml.list_events()
    assert ml.transition("ghost-000000", P, A, Reason.ADMITTED) is None
    assert ml.list_events() == before


def test_compare_and_set_lets_only_one_of_two_racing_writers_win(ml, db_path, clock):
    job = ml.create_job(spec(), "ann")
    other = open_store(db_path, clock=clock)
    try:
        won = ml.transition(job.id, P, A, Reason.ADMITTED, actor="one")
        lost = other.transition(job.id, P, C, Reason.CANCELLED_BY_USER, actor="two")
    finally:
        other.close()
    assert won is not None and lost is None
    assert ml.get_job(job.id).status is A
    transitions = [e for e in ml.list_events(object_id=job.id) if e.type == "JobTransition"]
    assert [(e.to_status, e.actor) for e in transitions] == [("ADMITTED", "one")]


@pytest.mark.parametrize("src, dst", [(P, R), (P, S), (A, S), (P, P)])
def test_illegal_transition_raises_and_changes_nothing(ml, src, dst):
    job = ml.create_job(spec(), "ann")
    before = ml.list_events()
    with pytest.raises(IllegalTransition):
        ml.transition(job.id, src, dst, Reason.STARTED)
    assert ml.get_job(job.id) == job
    assert ml.list_events() == before


def test_transition_out_of_a_terminal_status_is_illegal(ml):
    job = ml.create_job(spec(), "ann")
    ml.transition(job.id, P, C, Reason.CANCELLED_BY_USER, actor="ann")
    for dst in (P, A, R, S, F):
        with pytest.raises(IllegalTransition):
            ml.transition(job.id, C, dst, Reason.REQUEUED)
    assert ml.get_job(job.id).status is C


def test_running_sets_started_at_and_terminal_sets_finished_at(ml, clock):
    job = ml.create_job(spec(), "ann")
    clock.advance(1)
    admitted = ml.transition(job.id, P, A, Reason.ADMITTED)
    assert admitted.started_at is None and admitted.finished_at is None
    clock.advance(2)
    running = ml.transition(job.id, A, R, Reason.STARTED)
    assert running.started_at == clock.now
    assert running.finished_at is None
    started = clock.now
    clock.advance(30)
    done = ml.transition(job.id, R, S, Reason.COMPLETED, exit_code=0)
    assert done.status is S
    assert done.started_at == started
    assert done.finished_at == clock.now
    assert done.exit_code == 0


@pytest.mark.parametrize("dst, reason", [(F, Reason.EXIT_CODE), (C, Reason.CANCELLED_BY_USER)])
def test_every_terminal_status_sets_finished_at(ml, clock, dst, reason):
    job = ml.create_job(spec(), "ann")
    clock.advance(3)
    rec = ml.transition(job.id, P, dst, reason)
    assert rec.finished_at == clock.now
    assert rec.started_at is None


def test_requeue_goes_back_to_pending_and_can_count_restarts(ml, clock):
    job = ml.create_job(spec(), "ann")
    ml.transition(job.id, P, A, Reason.ADMITTED)
    ml.transition(job.id, A, R, Reason.STARTED)
    assert job.requeue_cause is None
    rec = ml.transition(
        job.id,
        R,
        P,
        Reason.REQUEUED,
        "node lost",
        requeue_cause=RequeueCause.NODE_LOST,
        restarts=1,
        attempt=1,
    )
    assert rec.status is P
    assert (rec.restarts, rec.attempt) == (1, 1)
    assert rec.finished_at is None
    assert rec.requeue_cause is RequeueCause.NODE_LOST
    assert ml.get_job(job.id).requeue_cause is RequeueCause.NODE_LOST
    # it stays, as the cause of the latest requeue, through the next admission
    assert ml.transition(job.id, P, A, Reason.ADMITTED).requeue_cause is RequeueCause.NODE_LOST
    statuses = [(e.from_status, e.to_status) for e in ml.list_events(object_id=job.id)]
    assert statuses == [
        (None, "PENDING"),
        ("PENDING", "ADMITTED"),
        ("ADMITTED", "RUNNING"),
        ("RUNNING", "PENDING"),
        ("PENDING", "ADMITTED"),
    ]


def test_a_requeue_names_its_cause_and_nothing_else_does(ml):
    job = ml.create_job(spec(), "ann")
    ml.transition(job.id, P, A, Reason.ADMITTED)
    with pytest.raises(ValueError):
        ml.transition(job.id, A, P, Reason.REQUEUED)
    with pytest.raises(ValueError):
        ml.transition(job.id, A, R, Reason.STARTED, requeue_cause=RequeueCause.PREEMPTED)
    assert ml.get_job(job.id).status is A


# -- wait messages -----------------------------------------------------------------


def _waiting_events(store, job_id):
    return [e for e in store.list_events(object_id=job_id) if e.type == "JobWaiting"]


def test_set_wait_message_writes_an_event_only_when_it_changes(ml, clock):
    job = ml.create_job(spec(), "ann")
    clock.advance(1)
    assert ml.set_wait_message(job.id, "waiting for capacity", WaitKind.CAPACITY) is True
    assert ml.get_job(job.id).message == "waiting for capacity"
    assert ml.get_job(job.id).updated_at == clock.now
    clock.advance(1)
    assert ml.set_wait_message(job.id, "waiting for capacity", WaitKind.CAPACITY) is False
    assert ml.get_job(job.id).updated_at == clock.now - 1
    assert ml.set_wait_message(job.id, "queued behind other", WaitKind.QUEUED_BEHIND) is True
    assert ml.set_wait_message(job.id, "queued behind other", WaitKind.QUEUED_BEHIND) is False
    events = _waiting_events(ml, job.id)
    assert [e.message for e in events] == ["waiting for capacity", "queued behind other"]
    assert all(e.team == "ml" and e.kind == "job" for e in events)


def test_set_wait_message_ignores_jobs_that_are_not_pending(ml):
    job = ml.create_job(spec(), "ann")
    ml.transition(job.id, P, A, Reason.ADMITTED)
    assert ml.set_wait_message(job.id, "waiting", WaitKind.CAPACITY) is False
    assert ml.get_job(job.id).message is None
    assert _waiting_events(ml, job.id) == []
    assert ml.set_wait_message("ghost-000000", "waiting", WaitKind.CAPACITY) is False


# -- listing -----------------------------------------------------------------------


def test_list_jobs_filters_by_team_and_status_newest_first(ml):
    ml.create_team("cv")
    a = ml.create_job(spec("a"), "ann")
    b = ml.create_job(spec("b", team="cv"), "ann")
    c = ml.create_job(spec("c"), "ann")
    ml.transition(c.id, P, A, Reason.ADMITTED)

    assert [j.id for j in ml.list_jobs()] == [c.id, b.id, a.id]
    assert [j.id for j in ml.list_jobs(team="ml")] == [c.id, a.id]
    assert [j.id for j in ml.list_jobs(team="cv")] == [b.id]
    assert [j.id for j in ml.list_jobs(statuses=[P])] == [b.id, a.id]
    assert [j.id for j in ml.list_jobs(team="ml", statuses=[P])] == [a.id]
    assert [j.id for j in ml.list_jobs(statuses=[P, A])] == [c.id, b.id, a.id]
    assert ml.list_jobs(statuses=[R]) == []
    assert ml.list_jobs(statuses=[]) == []
    assert ml.list_jobs(team="nlp") == []
    assert [j.id for j in ml.list_jobs(limit=2)] == [c.id, b.id]


def test_list_events_filters_by_team_object_and_after(ml):
    ml.create_team("cv")
    a = ml.create_job(spec("a"), "ann")
    b = ml.create_job(spec("b", team="cv"), "ann")
    ml.transition(a.id, P, A, Reason.ADMITTED)

    everything = ml.list_events()
    ids = [e.id for e in everything]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert [e.type for e in everything] == [
        "TeamCreated",
        "TeamCreated",
        "JobSubmitted",
        "JobSubmitted",
        "JobTransition",
    ]

    ml_events = ml.list_events(team="ml")
    assert {e.team for e in ml_events} == {"ml"}
    assert [e.type for e in ml_events] == ["TeamCreated", "JobSubmitted", "JobTransition"]

    assert [e.type for e in ml.list_events(object_id=a.id)] == ["JobSubmitted", "JobTransition"]
    assert [e.object_id for e in ml.list_events(team="cv", object_id=b.id)] == [b.id]
    assert ml.list_events(team="ml", object_id=b.id) == []

    cursor = everything[2].id
    assert ml.list_events(after=cursor) == everything[3:]
    assert ml.list_events(after=everything[-1].id) == []
    assert [e.id for e in ml.list_events(object_id=a.id, after=cursor)] == [everything[-1].id]
    assert ml.list_events(limit=2) == everything[:2]


def test_add_event(ml, clock):
    ml.add_event("node", "n1", None, "NodeLost", message="heartbeat missed", actor="monitor")
    ev = ml.list_events(object_id="n1")[0]
    assert (ev.kind, ev.type, ev.team, ev.message, ev.actor) == (
        "node",
        "NodeLost",
        None,
        "heartbeat missed",
        "monitor",
    )
    assert ev.ts == clock.now


def test_state_survives_reopening_the_file(db_path, clock):
    first = open_store(db_path, clock=clock)
    first.create_team("ml")
    first.create_user("ann", "ml", "member")
    token = first.create_token("ann")
    job = first.create_job(spec(), "ann")
    first.close()

    second = open_store(db_path, clock=clock)
    try:
        assert second.get_job(job.id) == job
        assert second.authenticate(token) == Principal("ann", "ml", "member")
        assert second.list_teams() == ["ml"]
    finally:
        second.close()


def test_migrations_match_the_models(db_path):
    """The Alembic revisions build exactly the schema the ORM models describe."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from aicluster.store.schema import Base

    store = open_store(db_path)
    with store.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []
    store.close()
    open_store(db_path).close()  # a second open finds it current
