"""Token usage through the real control plane's gateway, on the session Ray cluster: a
simulated-engine service of each of two teams, called with the official openai client
(whole and streamed answers) by a member of each; the ledger's totals per team and per
token equal the sum of the usage the answers carried, priced at the token price set for
the service; a member sees their team's usage only; the CLI shows the same."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from typer.testing import CliRunner

from aicluster.cli.main import app

from harness import api, simulated_services, wait_for

pytestmark = pytest.mark.ray
TEAMS = ("tu-a", "tu-b")


@pytest.fixture(scope="module")
def world(control_plane, admin):
    callers = simulated_services(control_plane, admin, TEAMS, "tu-chat", time_scale=0.05)
    yield callers
    for team in TEAMS:
        api(control_plane, "DELETE", "/v1/services/tu-chat", params={"team": team})


def calls(url: str, token: str) -> list[int]:
    """Whole and streamed answers; [requests, prompt, completion] as the answers said."""
    c = openai.OpenAI(base_url=url + "/v1", api_key=token, max_retries=0)
    usages = [
        c.completions.create(model="tu-chat", prompt="hello there", max_tokens=3).usage,
        c.chat.completions.create(
            model="tu-chat", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        ).usage,
    ]
    stream = c.chat.completions.create(
        model="tu-chat",
        messages=[{"role": "user", "content": "stream please"}],
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    usages += [ch.usage for ch in stream if ch.usage is not None]
    got = [len(usages), sum(u.prompt_tokens for u in usages)]
    got.append(sum(u.completion_tokens for u in usages))
    bare = c.completions.create(model="tu-chat", prompt="x", max_tokens=6, stream=True)
    got[0] += 1  # no usage in this stream: the gateway counts its content chunks
    got[2] += sum(1 for ch in bare if ch.choices and ch.choices[0].text)
    return got


def groups(cp, token: str | None, by: str, **params) -> dict:
    r = api(cp, "GET", "/v1/usage/tokens", token, params={"since": "1h", "by": by, **params})
    assert r.status_code == 200, r.text
    return {g["key"]: g for g in r.json()["groups"]}


def test_usage_totals_per_team_and_token_equal_what_the_engines_reported(control_plane, world):
    url = control_plane.url
    r = api(
        control_plane,
        "PUT",
        "/v1/prices/tokens",
        json={"service": "tu-a/tu-chat", "input_mtok": 2.0, "output_mtok": 5.0},
    )
    assert r.status_code == 200 and r.json()["input_mtok"] == 2.0, r.text
    want = {team: calls(url, world[team]["token"]) for team in TEAMS}
    ids = {team: str(world[team]["id"]) for team in TEAMS}

    def recorded() -> bool:
        got = groups(control_plane, None, "token")
        return all(ids[t] in got and got[ids[t]]["requests"] >= want[t][0] for t in TEAMS)

    wait_for(recorded, timeout=30, what="the gateway's usage batches")
    by_token = groups(control_plane, None, "token")
    by_team = groups(control_plane, None, "team")
    for team in TEAMS:
        for g in (by_token[ids[team]], by_team[team]):
            assert [g["requests"], g["prompt_tokens"], g["completion_tokens"]] == want[team]
            assert g["errors"] == 0
    a = by_team["tu-a"]
    assert a["cost_micros"] == a["prompt_tokens"] * 2 + a["completion_tokens"] * 5
    assert by_team["tu-b"]["cost_micros"] == 0  # no price for tu-b's service
    services = groups(control_plane, None, "service")
    assert services["tu-a/tu-chat"]["prompt_tokens"] == want["tu-a"][1]


def test_a_member_sees_their_teams_usage_only(control_plane, world):
    token = world["tu-a"]["token"]
    mine = groups(control_plane, token, "team")
    assert set(mine) <= {"tu-a"}
    r = api(control_plane, "GET", "/v1/usage/tokens", token, params={"team": "tu-b"})
    assert r.status_code == 404 and r.json()["detail"]["message"] == "team 'tu-b' not found"
    r = api(control_plane, "GET", "/v1/usage/tokens", token, params={"by": "job"})
    assert r.status_code == 400 and r.json()["detail"]["field"] == "by"
    r = api(control_plane, "PUT", "/v1/prices/tokens", token, json={"input_mtok": 1.0})
    assert r.status_code == 403


def test_cli_prices_and_token_usage(control_plane, world):
    base = ["--url", control_plane.url, "--token", control_plane.admin_token]
    runner = CliRunner()
    made = runner.invoke(
        app,
        [
            "prices",
            "set",
            "--input-per-mtok",
            "0.5",
            "--output-per-mtok",
            "1.5",
            "--service",
            "tu-b/tu-chat",
            *base,
        ],
    )
    assert made.exit_code == 0, made.output
    assert "service tu-b/tu-chat: input per Mtok 0.5, output per Mtok 1.5" in made.output
    prices = api(control_plane, "GET", "/v1/prices/tokens").json()["prices"]
    assert {"tu-a/tu-chat", "tu-b/tu-chat"} <= {p["service"] for p in prices}
    shown = runner.invoke(app, ["usage", "--tokens", "--by", "team", "-o", "json", *base])
    assert shown.exit_code == 0, shown.output
    report = json.loads(shown.stdout)
    assert report["by"] == "team" and report["total"]["requests"] >= 1
    bad = runner.invoke(app, ["usage", "--tokens", "--by", "pool", *base])
    assert bad.exit_code != 0 and "Traceback" not in bad.output
