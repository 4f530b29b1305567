"""Replicas answer only the platform: a direct request to a replica's URL without its
secret is refused, the same request through the gateway works, and the secret shows up
in no API answer, event or control-plane log."""

from __future__ import annotations

import httpx
import openai
import psutil
import pytest

from aicluster.runtime.replica_auth import SECRET_ENV, SECRET_HEADER

from harness import wait_for


def api(cp, method: str, path: str, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {cp.admin_token}"}
    return httpx.request(method, cp.url + path, headers=headers, timeout=30, **kw)


@pytest.fixture(scope="module")
def guarded(control_plane):
    spec = {
        "kind": "service",
        "name": "guarded",
        "model": "guarded-model",
        "engine": "simulated",
        "resources": {"cpus": 0.5},
        "replicas": {"min": 1, "max": 1},
        "readiness_timeout_s": 60,
    }
    assert api(control_plane, "POST", "/v1/services", json={"spec": spec}).status_code == 201
    wait_for(
        lambda: api(control_plane, "GET", "/v1/services/guarded").json()["ready"] == 1,
        timeout=90,
        what="a ready replica",
    )
    svc = api(control_plane, "GET", "/v1/services/guarded").json()
    yield next(r for r in svc["replicas"] if r["status"] == "READY")
    api(control_plane, "DELETE", "/v1/services/guarded")


def _secret_of(url: str) -> str:
    """The replica's secret, read from the environment of the process serving `url`."""
    port = int(url.rsplit(":", 1)[1])
    pids = [
        c.pid
        for c in psutil.net_connections("tcp")
        if c.status == "LISTEN" and c.laddr.port == port and c.pid
    ]
    assert pids, "no process listens on the replica's port"
    return psutil.Process(pids[0]).environ()[SECRET_ENV]


def test_a_replica_refuses_direct_requests_without_its_secret(control_plane, guarded):
    url = guarded["url"]
    assert httpx.get(url + "/v1/models").status_code == 401
    assert httpx.get(url + "/health").status_code == 401
    r = httpx.post(url + "/v1/completions", json={"model": "guarded", "prompt": "hi"})
    assert r.status_code == 401
    assert httpx.get(url + "/v1/models", headers={SECRET_HEADER: "guess"}).status_code == 401
    secret = _secret_of(url)
    ok = httpx.post(
        url + "/v1/completions",
        headers={SECRET_HEADER: secret},
        json={"model": "guarded", "prompt": "hi", "max_tokens": 2},
    )
    assert ok.status_code == 200


def test_the_same_request_through_the_gateway_works(control_plane, guarded):
    client = openai.OpenAI(
        base_url=control_plane.url + "/v1", api_key=control_plane.admin_token, max_retries=0
    )
    out = client.completions.create(model="guarded", prompt="hi", max_tokens=2)
    assert out.choices[0].text
    out = client.completions.create(model="default/guarded", prompt="hi", max_tokens=2)
    assert out.choices[0].text


def test_the_secret_is_in_no_answer_event_or_log(control_plane, guarded):
    secret = _secret_of(guarded["url"])
    assert len(secret) >= 32
    for path in ("/v1/services/guarded", "/v1/services", "/v1/events"):
        assert secret not in api(control_plane, "GET", path).text, path
    assert secret not in (control_plane.home / "controlplane.log").read_text(errors="replace")
