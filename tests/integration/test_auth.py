"""Every route but /healthz needs a token; a team never sees another team's jobs."""

from __future__ import annotations

import httpx
import pytest

from aicluster.client.api import ApiError

from harness import TERMINAL


@pytest.fixture(scope="module")
def teams(admin):
    for name in ("team-a", "team-b"):
        if name not in admin.teams():
            admin.create_team(name)
    return {
        "a": admin.create_token("alice", team="team-a")["token"],
        "b": admin.create_token("bob", team="team-b")["token"],
        "viewer": admin.create_token("vera", team="team-a", role="viewer")["token"],
    }


@pytest.mark.parametrize(
    "method,path",
    [
        ("GET", "/v1/jobs"),
        ("POST", "/v1/jobs"),
        ("GET", "/v1/nodes"),
        ("GET", "/v1/events"),
        ("GET", "/v1/jobs/x"),
        ("POST", "/v1/jobs/x/cancel"),
        ("GET", "/v1/jobs/x/logs"),
        ("GET", "/v1/teams"),
        ("POST", "/v1/tokens"),
        ("GET", "/v1/whoami"),
    ],
)
def test_routes_need_a_token(control_plane, method, path):
    r = httpx.request(method, control_plane.url + path, json={})
    assert r.status_code == 401
    r = httpx.request(
        method,
        control_plane.url + path,
        json={},
        headers={"Authorization": "Bearer aic_not-a-real-token"},
    )
    assert r.status_code == 401


def test_health_needs_no_token(control_plane):
    assert httpx.get(control_plane.url + "/healthz").json() == {"status": "ok"}


def test_tokens_are_stored_hashed(sqlite_state, teams):
    raw = sqlite_state.read_bytes()
    wal = sqlite_state.with_name("state.db-wal")
    raw += wal.read_bytes() if wal.exists() else b""
    for token in teams.values():
        assert token.encode() not in raw


def test_team_isolation(control_plane, admin, teams):
    alice, bob = control_plane.client(teams["a"]), control_plane.client(teams["b"])
    job = alice.submit(
        {
            "kind": "job",
            "name": "secret",
            "team": "team-a",
            "command": "echo top-secret; sleep 600",
        },
        None,
    )
    alice.wait(job["id"], {"RUNNING"}, timeout=60)
    assert job["id"] in {j["id"] for j in alice.jobs()}
    assert job["id"] not in {j["id"] for j in bob.jobs()}
    assert job["id"] not in {j["id"] for j in bob.jobs(team="team-a")}
    for call in (bob.job, bob.cancel, bob.logs):
        with pytest.raises(ApiError) as exc:
            call(job["id"])
        assert exc.value.status_code == 404
    assert all(e["team"] == "team-b" for e in bob.events())
    assert job["id"] in {j["id"] for j in admin.jobs()}
    # bob cannot submit into team-a; a viewer cannot submit or cancel at all
    with pytest.raises(ApiError) as exc:
        bob.submit({"kind": "job", "name": "sneak", "team": "team-a", "command": "true"}, None)
    assert exc.value.status_code == 422
    viewer = control_plane.client(teams["viewer"])
    assert job["id"] in {j["id"] for j in viewer.jobs()}
    with pytest.raises(ApiError) as exc:
        viewer.cancel(job["id"])
    assert exc.value.status_code == 403
    assert alice.job(job["id"])["status"] == "RUNNING"
    # Non-admins cannot create teams or tokens.
    with pytest.raises(ApiError) as exc:
        alice.create_team("team-c")
    assert exc.value.status_code == 403
    assert alice.cancel(job["id"])["status"] == "CANCELLED"
    assert alice.wait(job["id"], TERMINAL, 10)["status"] == "CANCELLED"


def test_bad_spec_is_rejected_and_nothing_stored(admin):
    before = len(admin.jobs(every=True))
    with pytest.raises(ApiError) as exc:
        admin.submit({"kind": "job", "name": "bad", "command": "true", "workerz": 2}, None)
    assert exc.value.status_code == 422
    assert "workerz" in exc.value.message and "unknown field" in exc.value.message
    assert len(admin.jobs(every=True)) == before
