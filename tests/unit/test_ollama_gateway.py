"""Ollama's API on the gateway, with the official `ollama` client, in front of a real
simulated engine replica served by uvicorn on loopback: chat and generate (streaming
NDJSON and whole), tags, show, embed (the simulated engine has none: a 501), the token
and the model name rules of the OpenAI routes, and Ollama's error shape."""

from __future__ import annotations

import httpx
import ollama
import pytest
from fastapi import FastAPI

from aicluster.control.endpoints import Endpoint, EndpointTable, ServiceEndpoints
from aicluster.gateway.proxy import Gateway
from aicluster.runtime.simulated_core import SimulatedEngineOptions
from aicluster.runtime.simulated_engine import create_app
from aicluster.store.identity import Principal

from asgi_server import serving
from harness import wait_for

SECRET = "replica-secret"
TOKENS = {
    "tok-a": Principal("alice", "team-a", "member"),
    "tok-b": Principal("bob", "team-b", "member"),
    "tok-admin": Principal("admin", None, "admin"),
}


@pytest.fixture(scope="module")
def gw():
    engine = create_app(SimulatedEngineOptions(model="chat", time_scale=0.01), secret=SECRET)
    with serving(engine) as replica:
        table = EndpointTable()
        table.publish(
            {
                ("team-a", "chat"): ServiceEndpoints(
                    "team-a",
                    "chat",
                    "simulated",
                    "least_outstanding",
                    {},
                    (Endpoint("r1", replica, SECRET),),
                    "chat",
                ),
                ("team-a", "cold"): ServiceEndpoints(
                    "team-a", "cold", "simulated", "least_outstanding", {"hold_timeout_s": 0.2}
                ),
            }
        )
        gateway = Gateway(table, TOKENS.get, scrape_interval_s=None)
        app = FastAPI()
        app.include_router(gateway.router())
        with serving(app) as url:
            yield table, url


def client(url: str, token: str = "tok-a") -> ollama.Client:
    return ollama.Client(host=url, headers={"Authorization": f"Bearer {token}"})


@pytest.mark.parametrize("model", ["chat", "team-a/chat"])
def test_chat_whole_and_streamed(gw, model):
    table, url = gw
    out = client(url).chat(
        model=model,
        messages=[{"role": "user", "content": "hello"}],
        options={"num_predict": 5},
        stream=False,
    )
    assert out.done and out.message.role == "assistant" and out.message.content
    assert out.model == model and out.eval_count == 5 and out.prompt_eval_count > 0
    assert out.done_reason == "length"
    parts = list(
        client(url).chat(
            model=model,
            messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
            options={"num_predict": 4},
            stream=True,
        )
    )
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert len(parts) >= 3 and "".join(p.message.content for p in parts).strip()
    assert parts[-1].eval_count == 4 and parts[-1].total_duration > 0
    wait_for(lambda: table.demand("team-a", "chat").ongoing == 0, timeout=5, what="finished")


def test_generate_whole_streamed_and_raw(gw):
    _table, url = gw
    out = client(url).generate(model="chat", prompt="once upon", options={"num_predict": 3})
    assert out.done and out.response and out.eval_count == 3
    parts = list(client(url).generate(model="chat", prompt="go on", system="s", stream=True))
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    assert "".join(p.response for p in parts).strip()
    raw = client(url).generate(
        model="chat", prompt="raw text", raw=True, options={"num_predict": 2}
    )
    assert raw.response and raw.eval_count == 2
    loaded = client(url).generate(model="chat")  # no prompt: Ollama only loads the model
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""


def test_tags_show_and_version(gw):
    _table, url = gw
    names = {m.model for m in client(url).list().models}
    assert names == {"chat", "cold"}
    assert {m.model for m in client(url, "tok-admin").list().models} == {
        "team-a/chat",
        "team-a/cold",
    }
    assert client(url, "tok-b").list().models == []
    info = client(url).show("chat")
    assert info.details.family == "simulated" and "completion" in info.capabilities
    assert info.modelinfo["aicluster.ready_replicas"] == 1
    r = httpx.get(url + "/api/version", headers={"Authorization": "Bearer tok-a"})
    assert r.status_code == 200 and r.json()["version"]


def test_embed_on_an_engine_without_embeddings_is_a_501(gw):
    _table, url = gw
    with pytest.raises(ollama.ResponseError) as exc:
        client(url).embed(model="chat", input=["a", "b"])
    assert exc.value.status_code == 501 and "embeddings" in exc.value.error


def test_errors_are_ollamas_shape(gw):
    table, url = gw
    with pytest.raises(ollama.ResponseError) as exc:
        client(url, "tok-wrong").chat(model="chat", messages=[{"role": "user", "content": "x"}])
    assert exc.value.status_code == 401
    with pytest.raises(ollama.ResponseError) as exc:  # another team's service: not found
        client(url, "tok-b").chat(
            model="team-a/chat", messages=[{"role": "user", "content": "x"}], stream=False
        )
    assert exc.value.status_code == 404 and "team-a/chat" in exc.value.error
    with pytest.raises(ollama.ResponseError) as exc:  # the engine's own 400, in words
        client(url).generate(model="chat", prompt="x", options={"num_predict": 0}, stream=False)
    assert exc.value.status_code == 400 and "max_tokens" in exc.value.error
    with pytest.raises(ollama.ResponseError) as exc:  # held, no replica came: 503
        client(url).generate(model="cold", prompt="x", stream=False)
    assert exc.value.status_code == 503 and "0.2 s" in exc.value.error
    assert table.demand("team-a", "cold").ongoing == 0
    headers = {"Authorization": "Bearer tok-a"}
    for body, field in [
        ({"model": "chat", "messages": "hi"}, "messages"),
        ({"model": "chat", "messages": [{"content": "x"}]}, "messages[0].role"),
        ({"model": "chat", "prompt": 3}, "prompt"),
        ({"model": "chat", "prompt": "x", "options": []}, "options"),
        ({"model": "chat", "prompt": "x", "stream": "yes"}, "stream"),
        ({"prompt": "x"}, "model"),
    ]:
        path = "/api/chat" if "messages" in body else "/api/generate"
        r = httpx.post(url + path, json=body, headers=headers)
        assert r.status_code == 400 and field in r.json()["error"], (body, r.text)
    r = httpx.post(url + "/api/chat", content=b"{nope", headers=headers)
    assert r.status_code == 400 and "JSON" in r.json()["error"]
