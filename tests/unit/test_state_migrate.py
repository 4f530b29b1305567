"""`aicluster state migrate --to postgresql://...` and `aicluster up --state`: an
installation's SQLite state copied to a real, empty PostgreSQL (tests/pgserver.py) and
verified; logins, jobs, events and the artifact index read back the same there; bad
locations are messages naming the option, never tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from aicluster.artifacts.manifest import FileEntry
from aicluster.cli.main import app
from aicluster.cli.state_cmds import state_location
from aicluster.core.lifecycle import JobStatus, Reason
from aicluster.core.model import Quota
from aicluster.core.nodestate import NodeState
from aicluster.specs import load_spec_text
from aicluster.store import open_store
from aicluster.store.artifacts import ArtifactIndex
from aicluster.store.identity import Principal
from aicluster.store.nodes import NodeStore
from aicluster.store.quotas import QuotaStore

P, A, R, S = JobStatus.PENDING, JobStatus.ADMITTED, JobStatus.RUNNING, JobStatus.SUCCEEDED


@pytest.fixture
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("AICLUSTER_HOME", str(h))
    monkeypatch.delenv("AICLUSTER_STATE", raising=False)
    return h


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def make_installation(path):
    """A SQLite state with what a platform accumulates; returns the user's token."""
    store = open_store(path)
    store.create_team("ml")
    store.create_user("ann", "ml", "member")
    token = store.create_token("ann")
    for i in range(3):
        spec = load_spec_text(f"kind: job\nname: train-{i}\nteam: ml\ncommand: x\n")
        job = store.create_job(spec, "ann")
        store.transition(job.id, P, A, Reason.ADMITTED, attempt=1, placement=["n1"])
        store.transition(job.id, A, R, Reason.STARTED)
        store.transition(job.id, R, S, Reason.COMPLETED, exit_code=0)
    index = ArtifactIndex(store)
    up = index.create_upload(
        "ml", "llm", "model", (FileEntry("w.bin", 3, "0" * 64),), tag="best", metadata={"a": 1}
    )
    index.commit_upload(up.id, lambda _u, _v, _t: "1" * 64)
    index.add_proofs("ml", ["0" * 64])
    QuotaStore(store).set(Quota("ml", "gpu", 4, memory=2**40))
    NodeStore(store).observe("n1", "host-1", NodeState.READY, machine_id="m1")
    store.close()
    return token


def test_migrate_copies_the_state_and_a_login_works_on_postgresql(home, pg_url):
    token = make_installation(home / "state.db")
    result = run("state", "migrate", "--to", pg_url)
    assert result.exit_code == 0, result.output
    for table in ("jobs", "events", "tokens", "artifact_versions", "artifact_tags"):
        assert table in result.output
    assert "MISMATCH" not in result.output

    old, new = open_store(home / "state.db"), open_store(pg_url)
    try:
        assert new.backend == "postgresql"
        assert new.authenticate(token) == Principal("ann", "ml", "member")
        assert new.list_jobs() == old.list_jobs() and len(new.list_jobs()) == 3
        assert new.list_events(limit=1000) == old.list_events(limit=1000)
        assert ArtifactIndex(new).list_artifacts() == ArtifactIndex(old).list_artifacts()
        assert ArtifactIndex(new).resolve("ml", "llm", "best").manifest_sha256 == "1" * 64
        assert QuotaStore(new).all() == QuotaStore(old).all()
        # keys continue after the copied ones
        last_seq = max(j.seq for j in old.list_jobs())
        last_event = old.list_events(limit=1000)[-1].id
        spec = load_spec_text("kind: job\nname: after\nteam: ml\ncommand: x\n")
        assert new.create_job(spec, "ann").seq > last_seq
        assert new.list_events(after=last_event)[0].type == "JobSubmitted"
        assert new.create_token("ann") != token
    finally:
        old.close()
        new.close()


def test_migrate_writes_nothing_to_a_database_that_is_not_empty(home, pg_url):
    make_installation(home / "state.db")
    assert run("state", "migrate", "--to", pg_url).exit_code == 0
    again = run("state", "migrate", "--to", pg_url)
    assert again.exit_code == 1
    assert "not empty" in again.output and "Traceback" not in again.output


def test_migrate_refuses_while_the_control_plane_runs(home, pg_url):
    make_installation(home / "state.db")
    (home / "controlplane.json").write_text(json.dumps({"pid": os.getpid(), "url": "x"}))
    result = run("state", "migrate", "--to", pg_url)
    assert result.exit_code == 1
    assert "control plane is running" in result.output and "aicluster down" in result.output


@pytest.mark.parametrize(
    ("to", "says"),
    [
        ("mysql://u@h/db", "--to: unsupported database 'mysql'"),
        ("postgresql://u@127.0.0.1:1/db", "--to: cannot open the state store"),
        ("postgresql://u@127.0.0.1", "--to: no database named"),
    ],
)
def test_bad_targets_are_messages_naming_the_option(home, to, says):
    make_installation(home / "state.db")
    result = run("state", "migrate", "--to", to)
    assert result.exit_code == 2
    assert says in result.output and "Traceback" not in result.output


def test_up_refuses_a_bad_state_before_starting_anything(home):
    result = run("up", "--state", "oracle://x/y")
    assert result.exit_code == 2
    assert "--state: unsupported database 'oracle'" in result.output
    result = run("up", "--state", "postgresql://nobody:secret@127.0.0.1:1/db")
    assert result.exit_code == 2
    assert "--state: cannot open the state store" in result.output
    assert "secret" not in result.output
    assert not (home / "platform.json").exists() and not (home / "state.json").exists()


def test_the_state_location_precedence(home, monkeypatch):
    assert state_location(home, None) == (f"sqlite:///{home / 'state.db'}", "the default")
    (home / "state.json").write_text(json.dumps({"url": "postgresql://a@h/file"}))
    assert state_location(home, None)[0] == "postgresql+psycopg://a@h/file"
    monkeypatch.setenv("AICLUSTER_STATE", "postgres://a@h/env")
    assert state_location(home, None)[0] == "postgresql+psycopg://a@h/env"
    assert state_location(home, "other.db")[0].endswith("/other.db")


def test_the_control_plane_says_which_state_it_cannot_open(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "aicluster.api.server", "--home", str(tmp_path)]
        + ["--ray-address", "127.0.0.1:1", "--state", "postgresql://u:pw@127.0.0.1:1/db"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0
    assert "--state: cannot open the state store" in proc.stderr
    assert "Traceback" not in proc.stderr and "pw@" not in proc.stderr
