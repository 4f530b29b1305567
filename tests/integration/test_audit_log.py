"""The audit log live (the real control plane on loopback, its SQLite store): every
mutating call this test makes, allowed or refused, has an entry naming the caller, the
route, the target, the status and the address; no entry, and no byte of the store's
audit table, holds a token; only admins read the log (and reading it is audited)."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from sqlalchemy import text as sql
from typer.testing import CliRunner

from aicluster.cli.main import app

from harness import TERMINAL

pytestmark = pytest.mark.ray
TEAM = "aud-a"


@pytest.fixture(scope="module")
def people(admin, control_plane):
    if TEAM not in admin.teams():
        admin.create_team(TEAM)
    return {
        "member": admin.create_token("aud-alice", team=TEAM)["token"],
        "viewer": admin.create_token("aud-vera", team=TEAM, role="viewer")["token"],
    }


def call(url: str, method: str, path: str, token: str | None, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.request(method, url + path, headers=headers, timeout=30, **kw)


def entries_since(admin, since: float, user: str | None = None) -> list[dict]:
    out, after = [], 0
    while True:
        page = admin.audit(since=f"{max(1, int(time.time() - since) + 2)}s", user=user, after=after)
        out += page["entries"]
        if page["next"] is None:
            return [e for e in out if e["ts"] >= since]
        after = page["next"]


def test_every_mutating_call_has_an_entry_and_none_holds_a_token(
    control_plane, admin, people, state_db
):
    url, started = control_plane.url, time.time()
    member, viewer, root = people["member"], people["viewer"], control_plane.admin_token
    job = {"spec": {"kind": "job", "name": "aud-job", "team": TEAM, "command": "sleep 30"}}
    made = []  # (method, route, status, user, target part)

    def expect(method, path, route, token, user, status, target=None, **kw):
        r = call(url, method, path, token, **kw)
        assert r.status_code == status, (method, path, r.status_code, r.text)
        made.append((method, route, status, user, target))
        return r

    new = expect(
        "POST",
        "/v1/tokens",
        "/v1/tokens",
        root,
        "admin",
        201,
        "user=aud-bob",
        json={"user": "aud-bob", "team": TEAM},
    )
    bob = new.json()["token"]
    job_id = expect(
        "POST", "/v1/jobs", "/v1/jobs", member, "aud-alice", 201, "job=", json=job
    ).json()["id"]
    expect(
        "POST",
        f"/v1/jobs/{job_id}/cancel",
        "/v1/jobs/{job_id}/cancel",
        member,
        "aud-alice",
        200,
        f"job_id={job_id}",
    )
    expect("POST", "/v1/jobs", "/v1/jobs", viewer, "aud-vera", 403, json=job)
    expect(
        "POST",
        "/v1/teams",
        "/v1/teams",
        member,
        "aud-alice",
        403,
        "team=aud-sneak",
        json={"name": "aud-sneak"},
    )
    expect("POST", "/v1/teams", "/v1/teams", None, None, 401, json={"name": "aud-sneak"})
    expect(
        "POST",
        "/v1/teams",
        "/v1/teams",
        "aic_not-a-real-token",
        None,
        401,
        json={"name": "aud-sneak"},
    )
    expect(
        "PUT",
        f"/v1/teams/{TEAM}/quotas/gpu",
        "/v1/teams/{team}/quotas/{pool}",
        root,
        "admin",
        200,
        f"team={TEAM} pool=gpu",
        json={"gpus": 1},
    )
    expect("POST", "/v1/teams", "/v1/teams", root, "admin", 422, json={"name": "Bad Name"})
    expect("PUT", "/v1/prices", "/v1/prices", bob, "aud-bob", 403, json={"gpu_hour": 1.0})
    admin.wait(job_id, TERMINAL, 60)

    got = entries_since(admin, started)
    for method, route, status, user, target in made:
        matches = [
            e
            for e in got
            if (e["method"], e["route"], e["status"], e["user"]) == (method, route, status, user)
            and (target is None or target in (e["target"] or ""))
        ]
        assert matches, f"no audit entry for {method} {route} {status} by {user}: {got}"
        e = matches[0]
        assert e["source"] == "127.0.0.1"
        if user == "aud-alice":
            assert (e["role"], e["team"]) == ("member", TEAM)
    assert len(got) >= len(made)
    assert not [e for e in got if e["method"] == "GET" and e["route"] != "/v1/audit"]

    secrets = [member, viewer, root, bob]
    text = json.dumps(got)
    assert not [s for s in secrets if s in text]
    with state_db.connect() as conn:  # the table itself, on SQLite or PostgreSQL
        rows = conn.execute(sql("SELECT * FROM audit_log")).fetchall()
    assert len(rows) >= len(made)
    dump = repr(rows)
    assert not [s for s in secrets if s in dump or s[4:] in dump]


def test_only_admins_read_the_audit_log(control_plane, admin, people):
    started = time.time()
    for who in ("member", "viewer"):
        r = call(control_plane.url, "GET", "/v1/audit", people[who])
        assert r.status_code == 403, r.text
        assert "admins only" in r.json()["detail"]["message"]
    assert call(control_plane.url, "GET", "/v1/audit", None).status_code == 401
    r = call(
        control_plane.url,
        "GET",
        "/v1/audit",
        control_plane.admin_token,
        params={"since": "yesterday"},
    )
    assert r.status_code == 400 and r.json()["detail"]["field"] == "since"
    refused = entries_since(admin, started, user="aud-alice")
    assert [(e["route"], e["status"]) for e in refused] == [("/v1/audit", 403)]


def test_cli_shows_the_log_to_admins_and_refuses_members(control_plane, admin, people):
    r = call(control_plane.url, "POST", "/v1/teams", people["member"], json={"name": "aud-cli"})
    assert r.status_code == 403
    base = ["--url", control_plane.url]
    res = CliRunner().invoke(
        app,
        [
            "audit",
            "--since",
            "1h",
            "--user",
            "aud-alice",
            "-o",
            "json",
            *base,
            "--token",
            control_plane.admin_token,
        ],
    )
    assert res.exit_code == 0, res.output
    shown = json.loads(res.stdout)
    assert shown and all(e["user"] == "aud-alice" for e in shown)
    assert any(e["target"] == "team=aud-cli" and e["status"] == 403 for e in shown)
    table = CliRunner().invoke(app, ["audit", *base, "--token", control_plane.admin_token])
    assert table.exit_code == 0 and "POST /v1/teams" in table.stdout
    refused = CliRunner().invoke(app, ["audit", *base, "--token", people["member"]])
    assert refused.exit_code == 1
    assert "admins only" in refused.output and "Traceback" not in refused.output
