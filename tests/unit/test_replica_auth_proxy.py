"""A replica answers only the platform (runtime.replica_auth): the engines' own check,
and the authenticating proxy in front of engines that cannot check a header, with the
real simulated engine behind it."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from aicluster.runtime.replica_auth import SECRET_ENV, SECRET_HEADER, AuthProxy, listen
from aicluster.runtime.replica_main import secure_plan
from aicluster.runtime.simulated_core import SimulatedEngineOptions
from aicluster.runtime.simulated_engine import create_app
from aicluster.specs.service import ServiceSpec

from asgi_server import serving
from harness import free_port

SECRET = "s3cret-for-tests"
OPTIONS = SimulatedEngineOptions(model="sim", time_scale=0.01)


def test_simulated_engine_refuses_requests_without_its_secret():
    with serving(create_app(OPTIONS, secret=SECRET)) as url:
        for path in ("/v1/models", "/health", "/metrics"):
            r = httpx.get(url + path)
            assert r.status_code == 401, path
            assert r.json()["error"]["type"] == "authentication_error"
        assert httpx.get(url + "/v1/models", headers={SECRET_HEADER: "wrong"}).status_code == 401
        r = httpx.post(url + "/v1/completions", json={"model": "sim", "prompt": "hi"})
        assert r.status_code == 401
        ok = httpx.get(url + "/v1/models", headers={SECRET_HEADER: SECRET})
        assert ok.status_code == 200 and ok.json()["data"][0]["id"] == "sim"


@pytest.fixture()
def proxied_engine():
    """The simulated engine with no check of its own, behind the auth proxy."""
    with serving(create_app(OPTIONS)) as engine_url:
        port = int(engine_url.rsplit(":", 1)[1])
        proxy = AuthProxy(listen("127.0.0.1", 0), "127.0.0.1", port, SECRET).start()
        try:
            yield f"http://127.0.0.1:{proxy.sock.getsockname()[1]}"
        finally:
            proxy.stop()


def test_auth_proxy_refuses_connections_without_the_secret(proxied_engine):
    r = httpx.get(proxied_engine + "/v1/models")
    assert r.status_code == 401 and r.json()["error"]["code"] == "replica_secret_required"
    r = httpx.post(
        proxied_engine + "/v1/completions",
        headers={SECRET_HEADER: "nope"},
        json={"model": "sim", "prompt": "hi"},
    )
    assert r.status_code == 401


def test_auth_proxy_passes_requests_and_streams_with_the_secret(proxied_engine):
    client = openai.OpenAI(
        base_url=proxied_engine + "/v1",
        api_key="unused",
        max_retries=0,
        default_headers={SECRET_HEADER: SECRET},
    )
    for i in range(3):  # keep-alive: several requests on one connection
        out = client.completions.create(model="sim", prompt=f"hello {i}", max_tokens=3)
        assert out.choices[0].text
    stream = client.chat.completions.create(
        model="sim", max_tokens=5, stream=True, messages=[{"role": "user", "content": "hi"}]
    )
    pieces = [
        c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content
    ]
    assert len(pieces) == 5
    with pytest.raises(openai.NotFoundError):  # the engine's own answers pass through as is
        client.completions.create(model="other", prompt="x", max_tokens=1)


def test_auth_proxy_answers_502_while_the_engine_is_not_listening():
    proxy = AuthProxy(listen("127.0.0.1", 0), "127.0.0.1", free_port(), SECRET).start()
    try:
        url = f"http://127.0.0.1:{proxy.sock.getsockname()[1]}/health"
        assert httpx.get(url, headers={SECRET_HEADER: SECRET}).status_code == 502
        assert httpx.get(url).status_code == 401
    finally:
        proxy.stop()


def _env(port: int, secret: str | None) -> dict[str, str]:
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "PATH": "/usr/bin"}
    if secret:
        env[SECRET_ENV] = secret
    return env


def test_engines_that_check_the_secret_get_it_and_no_proxy():
    spec = ServiceSpec(name="svc", model="m", engine="simulated")
    port = free_port()
    plan, proxy = secure_plan(spec, _env(port, SECRET))
    assert proxy is None and plan.port == port and plan.env[SECRET_ENV] == SECRET
    assert SECRET not in json.dumps(plan.argv)  # never on the command line


def test_other_engines_listen_privately_behind_the_proxy_without_the_secret():
    spec = ServiceSpec(name="svc", model="meta/llama", engine="vllm")
    port = free_port()
    plan, proxy = secure_plan(spec, _env(port, SECRET))
    try:
        assert proxy is not None and proxy.sock.getsockname()[1] == port
        assert plan.host == "127.0.0.1" and plan.port != port
        assert SECRET_ENV not in plan.env and SECRET not in json.dumps(plan.argv)
        r = httpx.get(f"http://127.0.0.1:{port}/v1/models")
        assert r.status_code == 401
    finally:
        proxy.stop()
        proxy.sock.close()


def test_without_a_secret_nothing_changes():
    spec = ServiceSpec(name="svc", model="meta/llama", engine="vllm")
    port = free_port()
    plan, proxy = secure_plan(spec, _env(port, None))
    assert proxy is None and plan.port == port
