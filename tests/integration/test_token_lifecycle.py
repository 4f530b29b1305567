"""Token lifecycle live (the real control plane on loopback): a token made with an expiry
stops working when it expires, with a 401 that says so; users list their tokens without
the secrets (admins anyone's) and see when each was last used; a revoked token gets a 401
that says so; the CLI does the same, with no traceback for a mistake."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from typer.testing import CliRunner

from aicluster.cli.main import app

from harness import wait_for

pytestmark = pytest.mark.ray
TEAM = "tok-a"


@pytest.fixture(scope="module")
def team(admin):
    if TEAM not in admin.teams():
        admin.create_team(TEAM)
    return TEAM


def whoami(url: str, token: str) -> httpx.Response:
    return httpx.get(url + "/v1/whoami", headers={"Authorization": f"Bearer {token}"})


def get(url: str, path: str, token: str, **params) -> httpx.Response:
    return httpx.get(url + path, params=params, headers={"Authorization": f"Bearer {token}"})


def test_an_expired_token_gets_401_saying_so(control_plane, admin, team):
    made = admin.create_token("tok-eve", team=team, expires_in="3s")
    assert made["expires_at"] == pytest.approx(time.time() + 3, abs=2)
    assert whoami(control_plane.url, made["token"]).status_code == 200
    wait_for(
        lambda: whoami(control_plane.url, made["token"]).status_code == 401,
        timeout=30,
        what="the token to expire",
    )
    r = whoami(control_plane.url, made["token"])
    assert "API token expired" in r.json()["detail"]["message"]
    assert r.headers["WWW-Authenticate"] == "Bearer"
    (listed,) = admin.tokens("tok-eve")
    assert listed["state"] == "expired" and listed["id"] == made["id"]


def test_bad_expiry_is_a_400_naming_the_field(control_plane, admin, team):
    for bad in ("30x", "0d", "forever"):
        r = httpx.post(
            control_plane.url + "/v1/tokens",
            json={"user": "tok-never", "team": team, "expires_in": bad},
            headers={"Authorization": f"Bearer {control_plane.admin_token}"},
        )
        assert r.status_code == 400 and r.json()["detail"]["field"] == "expires_in", r.text
    assert "tok-never" not in {t["user"] for t in admin.tokens(all_users=True)}


def test_list_without_secrets_last_use_and_revoke(control_plane, admin, team):
    url = control_plane.url
    first = admin.create_token("tok-ann", team=team)
    second = admin.create_token("tok-ann", team=team, expires_in="30d")
    bob = admin.create_token("tok-bob", team=team)
    assert whoami(url, first["token"]).status_code == 200

    r = get(url, "/v1/tokens", first["token"])
    assert r.status_code == 200
    assert first["token"] not in r.text and second["token"] not in r.text
    mine = {t["id"]: t for t in r.json()["tokens"]}
    assert set(mine) == {first["id"], second["id"]}
    assert first["token"].startswith(mine[first["id"]]["prefix"])
    assert mine[first["id"]]["last_used_at"] is not None  # this very call, or the whoami
    assert mine[second["id"]]["expires_at"] == second["expires_at"]
    assert {t["state"] for t in mine.values()} == {"active"}

    assert get(url, "/v1/tokens", first["token"], user="tok-bob").status_code == 403
    assert [t["id"] for t in admin.tokens("tok-bob")] == [bob["id"]]
    other = httpx.post(
        f"{url}/v1/tokens/{bob['id']}/revoke",
        headers={"Authorization": f"Bearer {first['token']}"},
    )
    assert other.status_code == 404  # another user's token does not leak

    revoked = httpx.post(
        f"{url}/v1/tokens/{second['id']}/revoke",
        headers={"Authorization": f"Bearer {first['token']}"},
    )
    assert revoked.status_code == 200 and revoked.json()["state"] == "revoked"
    r = whoami(url, second["token"])
    assert r.status_code == 401 and "API token revoked" in r.json()["detail"]["message"]
    assert whoami(url, first["token"]).status_code == 200
    assert admin.revoke_token(bob["id"])["state"] == "revoked"
    assert whoami(url, bob["token"]).status_code == 401
    revokes = [
        e
        for e in admin.audit(since="1h", user="tok-ann")["entries"]
        if e["route"] == "/v1/tokens/{token_id}/revoke"
    ]
    assert {(e["status"], e["target"]) for e in revokes} >= {
        (404, f"token_id={bob['id']}"),
        (200, f"token_id={second['id']} user=tok-ann"),
    }


def test_cli_create_list_revoke(control_plane, admin, team):
    base = ["--url", control_plane.url, "--token", control_plane.admin_token]
    runner = CliRunner()
    made = runner.invoke(
        app, ["tokens", "create", "--user", "tok-cli", "--team", team, "--expires", "30d", *base]
    )
    assert made.exit_code == 0, made.output
    token = made.stdout.strip()
    assert token.startswith("aic_") and "\n" not in token
    listed = runner.invoke(app, ["tokens", "list", "--user", "tok-cli", "-o", "json", *base])
    assert listed.exit_code == 0 and token not in listed.stdout
    (t,) = json.loads(listed.stdout)
    assert t["expires_at"] == pytest.approx(time.time() + 30 * 86400, abs=60)
    table = runner.invoke(app, ["tokens", "list", "--all", *base])
    assert table.exit_code == 0 and "tok-cli" in table.stdout and token not in table.stdout
    own = ["--url", control_plane.url, "--token", token]
    done = runner.invoke(app, ["tokens", "revoke", str(t["id"]), *own])
    assert done.exit_code == 0 and f"revoked token {t['id']}" in done.stdout
    refused = runner.invoke(app, ["tokens", "list", *own])
    assert refused.exit_code == 1
    assert "API token revoked" in refused.output and "Traceback" not in refused.output
    bad = runner.invoke(
        app, ["tokens", "create", "--user", "tok-cli2", "--team", team, "--expires", "soon", *base]
    )
    assert bad.exit_code == 1 and "expires_in" in bad.output and "Traceback" not in bad.output
