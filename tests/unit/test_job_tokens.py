"""Scoped job tokens and team workload users in the store: one live token per job
attempt, dead when the attempt ends or expires; never an admin; uids never shared."""

from __future__ import annotations

import pytest

from aicluster.core.lifecycle import JobStatus, Reason
from aicluster.specs import load_spec_text
from aicluster.store import open_store
from aicluster.store.errors import NotFound
from aicluster.store.identity import WORKLOAD_UID_BASE

P, A, R, S = JobStatus.PENDING, JobStatus.ADMITTED, JobStatus.RUNNING, JobStatus.SUCCEEDED


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def store(state_url, clock):
    st = open_store(state_url, clock=clock)  # SQLite and PostgreSQL (tests/pgserver.py)
    st.create_team("ml")
    st.create_team("cv")
    st.create_user("root-ish", None, "admin")
    yield st
    st.close()


def running_job(store, owner="root-ish", team="ml", attempt=1):
    spec = load_spec_text(f"kind: job\nname: train\nteam: {team}\ncommand: x\n")
    job = store.create_job(spec, owner)
    store.transition(job.id, P, A, Reason.ADMITTED, attempt=attempt)
    store.transition(job.id, A, R, Reason.STARTED)
    return job


def test_an_admins_job_token_acts_as_a_member_of_the_jobs_team(store):
    job = running_job(store)
    who = store.authenticate(store.create_job_token(job.id, 1))
    assert (who.user, who.team, who.role, who.job_id) == ("root-ish", "ml", "member", job.id)
    assert not who.is_admin
    assert who.may_write_artifact("ml", "train-ckpt")
    assert not who.may_write_artifact("ml", "other")
    assert not who.may_write_artifact("cv", "train-ckpt")


def test_one_live_token_per_job(store):
    job = running_job(store)
    first = store.create_job_token(job.id, 1)
    second = store.create_job_token(job.id, 1)
    assert store.authenticate(first) is None
    assert store.authenticate(second) is not None


def test_a_job_token_dies_with_its_attempt_and_its_job(store):
    job = running_job(store)
    token = store.create_job_token(job.id, 1)
    store.transition(job.id, R, S, Reason.EXIT_CODE, exit_code=0)
    assert store.authenticate(token) is None


def test_a_token_of_an_earlier_attempt_does_not_authenticate(store):
    job = running_job(store, attempt=2)
    assert store.authenticate(store.create_job_token(job.id, 1)) is None
    assert store.authenticate(store.create_job_token(job.id, 2)) is not None


def test_a_job_token_expires(store, clock):
    job = running_job(store)
    token = store.create_job_token(job.id, 1, ttl_s=60)
    clock.now += 59
    assert store.authenticate(token) is not None
    clock.now += 2
    assert store.authenticate(token) is None


def test_oversized_tokens_are_refused_without_hashing(store):
    assert store.authenticate("aic_" + "x" * 100_000) is None


def test_each_team_has_its_own_stable_workload_uid(store):
    ml, cv = store.team_uid("ml"), store.team_uid("cv")
    assert ml != cv and min(ml, cv) >= WORKLOAD_UID_BASE
    assert store.team_uid("ml") == ml
    with pytest.raises(NotFound):
        store.team_uid("nope")
