"""The gateway's usage capture, rate limits and 401s in front of a real simulated engine
replica, served by uvicorn on loopback, called with the official openai and ollama
clients: the tokens recorded per team and token equal the usage the answers carried
(whole, streamed with usage, streamed without: one token per content chunk); a team
over its request rate gets a 429 with Retry-After in OpenAI's (and Ollama's) shape while
another team's requests succeed; an expired or revoked token's 401 says which."""

from __future__ import annotations

import json

import httpx
import ollama
import openai
import pytest
from fastapi import FastAPI

from aicluster.control.endpoints import Endpoint, EndpointTable, ServiceEndpoints
from aicluster.gateway.proxy import Gateway
from aicluster.gateway.ratelimit import Limiter
from aicluster.gateway.usage import UsageRecorder
from aicluster.runtime.simulated_core import SimulatedEngineOptions
from aicluster.runtime.simulated_engine import create_app
from aicluster.store.identity import Principal, Refusal
from aicluster.store.rate_limits import RateLimit

from asgi_server import serving
from harness import wait_for

SECRET = "replica-secret"
CALLERS = {
    "tok-a": Principal("alice", "team-a", "member", token_id=11),
    "tok-b": Principal("bob", "team-b", "member", token_id=12),
    "tok-expired": Refusal("expired", 1_700_000_000.0),
    "tok-revoked": Refusal("revoked", None),
}


@pytest.fixture(scope="module")
def replica():
    with serving(
        create_app(SimulatedEngineOptions(model="chat", time_scale=0.01), secret=SECRET)
    ) as url:
        yield url


@pytest.fixture()
def gw(replica):
    table = EndpointTable()
    rows: list[dict] = []
    usage = UsageRecorder(lambda batch: rows.extend(batch["rows"]), source="gw-unit")
    limiter = Limiter()
    gateway = Gateway(table, CALLERS.get, usage=usage, limiter=limiter)
    reps = (Endpoint("r1", replica, SECRET),)
    table.publish(
        {
            (team, "chat"): ServiceEndpoints(
                team, "chat", "simulated", "least_outstanding", {}, reps, "chat"
            )
            for team in ("team-a", "team-b")
        }
    )
    app = FastAPI()
    app.include_router(gateway.router())
    with serving(app) as url:
        yield url, usage, rows, limiter


def oai(url: str, token: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=token, max_retries=0)


def totals(usage: UsageRecorder, rows: list[dict], requests: int) -> dict:
    """Sums per (team, token) once `requests` requests are recorded."""

    def flushed():
        usage.flush()
        return sum(r["requests"] for r in rows) >= requests

    wait_for(flushed, timeout=10, what=f"{requests} requests recorded")
    out: dict = {}
    for r in rows:
        s = out.setdefault((r["team"], r["token_id"]), [0, 0, 0])
        s[0] += r["requests"]
        s[1] += r["prompt_tokens"]
        s[2] += r["completion_tokens"]
    return out


def test_recorded_tokens_equal_what_the_engine_reported(gw):
    url, usage, rows, _ = gw
    want = {("team-a", 11): [0, 0, 0], ("team-b", 12): [0, 0, 0]}
    for token, key in (("tok-a", ("team-a", 11)), ("tok-b", ("team-b", 12))):
        c = oai(url, token)
        out = c.completions.create(model="chat", prompt="hello there", max_tokens=3)
        chat = c.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        streamed = list(
            c.chat.completions.create(
                model="chat",
                messages=[{"role": "user", "content": "stream me"}],
                max_tokens=5,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        (last,) = [ch for ch in streamed if ch.usage is not None]
        for u in (out.usage, chat.usage, last.usage):
            want[key][0] += 1
            want[key][1] += u.prompt_tokens
            want[key][2] += u.completion_tokens
        bare = list(c.completions.create(model="chat", prompt="x", max_tokens=6, stream=True))
        want[key][0] += 1
        want[key][2] += sum(1 for ch in bare if ch.choices and ch.choices[0].text)
    assert totals(usage, rows, 8) == want
    assert {r["service"] for r in rows} == {"team-a/chat", "team-b/chat"}
    assert {r["model"] for r in rows} == {"chat"}


def test_ollama_routes_record_the_engines_usage(gw):
    url, usage, rows, _ = gw
    client = ollama.Client(host=url, headers={"Authorization": "Bearer tok-a"})
    whole = client.chat(
        model="chat", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 3}
    )
    parts = list(client.generate(model="chat", prompt="go on", stream=True))
    want = [2, whole.prompt_eval_count + parts[-1].prompt_eval_count]
    want.append(whole.eval_count + parts[-1].eval_count)
    assert totals(usage, rows, 2) == {("team-a", 11): want}


def test_a_team_over_its_rate_gets_429_and_another_team_does_not(gw):
    url, usage, rows, limiter = gw
    limiter.set_limits([RateLimit("team", "team-a", 0.01, 1, None, 0.0, "admin")])
    a, b = oai(url, "tok-a"), oai(url, "tok-b")
    assert a.completions.create(model="chat", prompt="x", max_tokens=1).choices
    with pytest.raises(openai.RateLimitError) as exc:
        a.completions.create(model="chat", prompt="x", max_tokens=1)
    assert exc.value.response.headers["Retry-After"] == "100"
    assert exc.value.body["code"] == "rate_limit_exceeded"
    assert "team team-a over 0.01 requests/s" in exc.value.body["message"]
    for _ in range(3):
        assert b.completions.create(model="chat", prompt="x", max_tokens=1).choices
    r = httpx.post(
        url + "/api/generate",
        json={"model": "chat", "prompt": "x", "stream": False},
        headers={"Authorization": "Bearer tok-a"},
    )
    assert r.status_code == 429 and r.headers["Retry-After"] == "100"
    assert "team team-a over" in r.json()["error"]
    # the two refusals are in the usage, as limited requests of team-a with no service
    want = {("team-a", 11, ""): [2, 2, 2], ("team-a", 11, "team-a/chat"): [1, 0, 0]}
    want[("team-b", 12, "team-b/chat")] = [3, 0, 0]
    wait_for(lambda: (usage.flush(), limited_sums(rows))[1] == want, timeout=10, what="usage")


def limited_sums(rows: list[dict]) -> dict:
    """(team, token, service) -> [requests, errors, limited]"""
    out: dict = {}
    for r in rows:
        s = out.setdefault((r["team"], r["token_id"], r["service"]), [0, 0, 0])
        for i, k in enumerate(("requests", "errors", "limited")):
            s[i] += r[k]
    return out


def test_expired_and_revoked_tokens_get_a_401_saying_which(gw):
    url, *_ = gw
    with pytest.raises(openai.AuthenticationError) as exc:
        oai(url, "tok-expired").completions.create(model="chat", prompt="x", max_tokens=1)
    assert exc.value.body["message"].startswith("API token expired at 2023-11-14 22:13:20 UTC")
    assert exc.value.body["code"] == "expired_api_key"
    with pytest.raises(openai.AuthenticationError) as exc:
        oai(url, "tok-revoked").models.list()
    assert exc.value.body["message"].startswith("API token revoked")
    with pytest.raises(openai.AuthenticationError) as exc:
        oai(url, "tok-nobody").models.list()
    assert exc.value.body["message"] == "missing or invalid API token"
    r = httpx.get(url + "/api/tags", headers={"Authorization": "Bearer tok-revoked"})
    assert r.status_code == 401 and json.loads(r.text)["error"].startswith("API token revoked")
    assert r.headers["WWW-Authenticate"] == "Bearer"
