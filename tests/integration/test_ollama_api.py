"""Ollama's API through the real control plane's gateway, on the session Ray cluster, with
the official `ollama` client: a `simulated` service with two replicas answers chat and
generate (streamed NDJSON and whole) under both spellings of its name, and lists in tags."""

from __future__ import annotations

import httpx
import ollama
import pytest

from harness import wait_for

pytestmark = pytest.mark.ray


def api(cp, method: str, path: str, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {cp.admin_token}"}
    return httpx.request(method, cp.url + path, headers=headers, timeout=30, **kw)


@pytest.fixture(scope="module")
def olla(control_plane):
    spec = {
        "kind": "service",
        "name": "olla",
        "model": "sim-model",
        "engine": "simulated",
        "resources": {"cpus": 0.5},
        "replicas": {"min": 2, "max": 2},
        "engine_args": {"time-scale": 0.05},
        "routing": {"policy": "prefix_cache"},
    }
    r = api(control_plane, "POST", "/v1/services", json={"spec": spec})
    assert r.status_code == 201, r.text
    wait_for(
        lambda: api(control_plane, "GET", "/v1/services/olla").json()["ready"] == 2,
        timeout=90,
        what="2 ready replicas",
    )
    yield ollama.Client(
        host=control_plane.url, headers={"Authorization": f"Bearer {control_plane.admin_token}"}
    )
    api(control_plane, "DELETE", "/v1/services/olla")


@pytest.mark.parametrize("model", ["olla", "default/olla"])
def test_ollama_client_chat_and_generate_through_the_cluster(olla, model):
    out = olla.chat(
        model=model,
        messages=[{"role": "user", "content": "hello"}],
        options={"num_predict": 4},
        stream=False,
    )
    assert out.done and out.message.content and out.eval_count == 4 and out.model == model
    parts = list(
        olla.chat(model=model, messages=[{"role": "user", "content": "stream"}], stream=True)
    )
    assert parts[-1].done and not any(p.done for p in parts[:-1]) and len(parts) >= 2
    gen = olla.generate(model=model, prompt="once upon a time", options={"num_predict": 3})
    assert gen.done and gen.response and gen.eval_count == 3
    streamed = list(olla.generate(model=model, prompt="go", stream=True))
    assert streamed[-1].done and "".join(p.response for p in streamed).strip()


def test_ollama_client_lists_and_shows_services(olla):
    assert "olla" in {m.model for m in olla.list().models}
    info = olla.show("olla")
    assert info.modelinfo["aicluster.ready_replicas"] == 2
    with pytest.raises(ollama.ResponseError) as exc:
        olla.show("no-such-service")
    assert exc.value.status_code == 404
