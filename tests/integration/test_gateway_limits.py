"""Rate limits and refused tokens through the real control plane's gateway, on the
session Ray cluster, with the official openai client: a team limited to 1 request/s gets
429s with Retry-After and OpenAI's error body while another team's requests succeed; a
token's own limit refuses that token and not its teammates; limits are set by admins
only, with 4xx naming the field, and members see theirs only; an expired and a revoked
token get a 401 from the gateway saying which; the CLI sets and lists limits."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from typer.testing import CliRunner

from aicluster.cli.main import app

from harness import api, simulated_services, wait_for

pytestmark = pytest.mark.ray
TEAMS = ("gl-a", "gl-b")


def oai(cp, token: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=cp.url + "/v1", api_key=token, max_retries=0)


@pytest.fixture(scope="module")
def world(control_plane, admin):
    callers = simulated_services(control_plane, admin, TEAMS, "gl-chat", time_scale=0.01)
    callers["gl-b-2"] = admin.create_token("gl-b-other", team="gl-b")
    yield callers
    for team in TEAMS:
        api(control_plane, "PUT", f"/v1/limits/teams/{team}", json={})
        api(control_plane, "DELETE", "/v1/services/gl-chat", params={"team": team})


def ask(client: openai.OpenAI) -> str:
    return client.completions.create(model="gl-chat", prompt="x", max_tokens=1).choices[0].text


def refused_within(client: openai.OpenAI, tries: int = 5) -> openai.RateLimitError | None:
    """The first 429 of up to `tries` requests back to back (None: all answered)."""
    for _ in range(tries):
        try:
            ask(client)
        except openai.RateLimitError as exc:
            return exc
    return None


def test_a_team_over_1_request_per_s_gets_429_another_team_does_not(control_plane, world):
    r = api(control_plane, "PUT", "/v1/limits/teams/gl-a", json={"requests_per_s": 1, "burst": 1})
    assert r.status_code == 200 and r.json()["requests_per_s"] == 1.0, r.text
    a, b = oai(control_plane, world["gl-a"]["token"]), oai(control_plane, world["gl-b"]["token"])
    seen: list[openai.RateLimitError] = []
    wait_for(
        lambda: bool(seen.append(refused_within(a)) or seen[-1]),
        timeout=30,
        what="the gateway to enforce gl-a's limit",
    )
    exc = seen[-1]
    assert exc.status_code == 429 and exc.response.headers["Retry-After"] == "1"
    assert exc.body["code"] == "rate_limit_exceeded" and exc.body["type"] == "requests"
    assert "team gl-a over 1 requests/s (burst 1)" in exc.body["message"]
    assert all(ask(b) for _ in range(5))  # gl-b has no limit
    r = httpx.post(
        control_plane.url + "/api/generate",
        json={"model": "gl-chat", "prompt": "x", "stream": False},
        headers={"Authorization": f"Bearer {world['gl-a']['token']}"},
    )
    assert r.status_code in (200, 429)  # Ollama's routes share the buckets
    if r.status_code == 429:
        assert "team gl-a over" in r.json()["error"] and r.headers["Retry-After"] == "1"


def test_a_tokens_limit_refuses_that_token_only(control_plane, world):
    other = world["gl-b-2"]
    r = api(
        control_plane,
        "PUT",
        f"/v1/limits/tokens/{other['id']}",
        json={"requests_per_s": 0.01, "burst": 1},
    )
    assert r.status_code == 200 and r.json()["token_id"] == other["id"], r.text
    limited = oai(control_plane, other["token"])
    seen: list = []
    wait_for(
        lambda: bool(seen.append(refused_within(limited)) or seen[-1]),
        timeout=30,
        what="the gateway to enforce the token's limit",
    )
    assert f"token {other['id']} over 0.01 requests/s" in seen[-1].body["message"]
    assert int(seen[-1].response.headers["Retry-After"]) >= 1
    assert all(ask(oai(control_plane, world["gl-b"]["token"])) for _ in range(3))


def test_limits_are_admins_to_set_strictly_and_members_see_theirs(control_plane, world):
    member = world["gl-a"]["token"]
    put = lambda path, body, token=None: api(control_plane, "PUT", path, token, json=body)
    r = put("/v1/limits/teams/gl-a", {"requests_per_s": 5}, member)
    assert r.status_code == 403
    r = put("/v1/limits/teams/gl-a", {"requests_per_s": -1})
    assert r.status_code == 422 and "requests_per_s" in r.text
    r = put("/v1/limits/teams/gl-a", {"rps": 1})
    assert r.status_code == 422 and "rps" in r.text
    r = put("/v1/limits/teams/gl-a", {"burst": 3})
    assert r.status_code == 400 and r.json()["detail"]["field"] == "burst"
    assert put("/v1/limits/teams/no-such-team", {"tokens_per_min": 5}).status_code == 404
    assert put("/v1/limits/tokens/999999", {"tokens_per_min": 5}).status_code == 404
    seen = api(control_plane, "GET", "/v1/limits", member).json()["limits"]
    assert {(x["scope"], x["subject"]) for x in seen} <= {("team", "gl-a")}
    every = api(control_plane, "GET", "/v1/limits").json()["limits"]
    assert ("token", str(world["gl-b-2"]["id"])) in {(x["scope"], x["subject"]) for x in every}


def test_expired_and_revoked_tokens_get_401_from_the_gateway_saying_which(control_plane, admin):
    soon = admin.create_token("gl-eve", team="gl-a", expires_in="2s")
    gone = admin.create_token("gl-rob", team="gl-a")
    admin.revoke_token(gone["id"])
    with pytest.raises(openai.AuthenticationError) as exc:
        ask(oai(control_plane, gone["token"]))
    assert exc.value.body["message"].startswith("API token revoked at ")
    assert exc.value.body["code"] == "revoked_api_key"

    def expired() -> bool:
        try:
            oai(control_plane, soon["token"]).models.list()
        except openai.AuthenticationError as e:
            return e.body["message"].startswith("API token expired at ")
        return False

    wait_for(expired, timeout=30, what="the token to expire")
    r = httpx.post(
        control_plane.url + "/api/chat",
        json={"model": "gl-chat", "messages": []},
        headers={"Authorization": f"Bearer {soon['token']}"},
    )
    assert r.status_code == 401 and r.json()["error"].startswith("API token expired at ")


def test_cli_sets_and_lists_limits(control_plane, world):
    base = ["--url", control_plane.url, "--token", control_plane.admin_token]
    runner = CliRunner()
    made = runner.invoke(app, ["limits", "set", "--team", "gl-b", "--tpm", "1000000", *base])
    assert made.exit_code == 0, made.output
    assert "team gl-b" in made.output and "1000000 tokens/min" in made.output
    listed = runner.invoke(app, ["limits", "-o", "json", *base])
    assert listed.exit_code == 0, listed.output
    rows = {(x["scope"], x["subject"]): x for x in json.loads(listed.stdout)["limits"]}
    assert rows[("team", "gl-b")]["tokens_per_min"] == 1_000_000
    bad = runner.invoke(app, ["limits", "set", "--team", "gl-b", "--rps", "-3", *base])
    assert bad.exit_code != 0 and "Traceback" not in bad.output
    assert runner.invoke(app, ["limits", "set", "--team", "gl-b", *base]).exit_code == 0
