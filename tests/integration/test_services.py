"""ApiOps on the session Ray cluster: replicas placed by the scheduler, the
gateway in the control plane, the official `openai` client through it."""

from __future__ import annotations

import httpx
import openai
import psutil
import pytest

from harness import wait_for


def sim_service(name: str, replicas: int = 2, **extra) -> dict:
    spec = {
        "kind": "service",
        "name": name,
        "model": "sim-model",
        "engine": "simulated",
        "resources": {"cpus": 0.5},
        "replicas": {"min": replicas, "max": max(replicas, 3)},
        "readiness_timeout_s": 60,
    }
    spec.update(extra)
    return spec


def api(cp, method: str, path: str, token: str | None = None, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token or cp.admin_token}"}
    return httpx.request(method, cp.url + path, headers=headers, timeout=30, **kw)


def ready_count(cp, name: str) -> int:
    return api(cp, "GET", f"/v1/services/{name}").json()["ready"]


@pytest.fixture(scope="module")
def chat_service(control_plane):
    r = api(control_plane, "POST", "/v1/services", json={"spec": sim_service("chat")})
    assert r.status_code == 201, r.text
    wait_for(lambda: ready_count(control_plane, "chat") == 2, timeout=90, what="2 ready replicas")
    yield "chat"
    api(control_plane, "DELETE", "/v1/services/chat")


def test_replicas_are_placed_and_ready(control_plane, chat_service):
    svc = api(control_plane, "GET", f"/v1/services/{chat_service}").json()
    ready = [r for r in svc["replicas"] if r["status"] == "READY"]
    assert len(ready) == 2
    assert all(r["node_id"] and r["url"].startswith("http://127.0.0.1:") for r in ready)


def test_openai_client_through_the_gateway(control_plane, chat_service):
    client = openai.OpenAI(base_url=control_plane.url + "/v1", api_key=control_plane.admin_token)
    models = [m.id for m in client.models.list().data]
    assert chat_service in models
    out = client.completions.create(model=chat_service, prompt="hello there", max_tokens=5)
    assert out.choices[0].text
    chat = client.chat.completions.create(
        model=chat_service, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert chat.choices[0].message.content
    stream = client.chat.completions.create(
        model=chat_service,
        messages=[{"role": "user", "content": "stream please"}],
        max_tokens=6,
        stream=True,
    )
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert len([p for p in pieces if p]) >= 2, pieces


def test_gateway_errors_are_openai_style(control_plane, chat_service):
    client = openai.OpenAI(base_url=control_plane.url + "/v1", api_key=control_plane.admin_token)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    bad = openai.OpenAI(base_url=control_plane.url + "/v1", api_key="aic_wrong")
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model=chat_service, prompt="x", max_tokens=1)
    r = httpx.post(
        control_plane.url + "/v1/completions",
        content=b"{not json",
        headers={"Authorization": f"Bearer {control_plane.admin_token}"},
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_killed_replica_is_replaced_and_requests_keep_working(control_plane, chat_service):
    client = openai.OpenAI(
        base_url=control_plane.url + "/v1", api_key=control_plane.admin_token, max_retries=0
    )
    api(control_plane, "POST", f"/v1/services/{chat_service}/scale", json={"replicas": 3})
    wait_for(lambda: ready_count(control_plane, chat_service) == 3, timeout=90, what="3 ready")
    svc = api(control_plane, "GET", f"/v1/services/{chat_service}").json()
    victim = next(r for r in svc["replicas"] if r["status"] == "READY")
    port = int(victim["url"].rsplit(":", 1)[1])
    pids = [
        c.pid
        for c in psutil.net_connections("tcp")
        if c.status == "LISTEN" and c.laddr.port == port and c.pid
    ]
    assert pids
    failures = 0
    for i in range(300):  # bounded load; the kill happens early in it
        if i == 20:
            psutil.Process(pids[0]).kill()
        try:
            client.completions.create(model=chat_service, prompt=f"req {i}", max_tokens=2)
        except openai.APIError:
            failures += 1
    assert failures == 0

    def replaced():
        s = api(control_plane, "GET", f"/v1/services/{chat_service}").json()
        ready = {r["id"] for r in s["replicas"] if r["status"] == "READY"}
        return len(ready) == 3 and victim["id"] not in ready

    wait_for(replaced, timeout=90, what="a replacement replica")
    history = api(control_plane, "GET", f"/v1/services/{chat_service}").json()["replicas"]
    dead = next(r for r in history if r["id"] == victim["id"])
    assert dead["status"] == "FAILED"


def test_scale_and_delete(control_plane):
    r = api(control_plane, "POST", "/v1/services", json={"spec": sim_service("scaler", replicas=1)})
    assert r.status_code == 201
    wait_for(lambda: ready_count(control_plane, "scaler") == 1, timeout=90, what="1 ready")
    r = api(control_plane, "POST", "/v1/services/scaler/scale", json={"replicas": 3})
    assert r.status_code == 200
    wait_for(lambda: ready_count(control_plane, "scaler") == 3, timeout=90, what="3 ready")
    api(control_plane, "POST", "/v1/services/scaler/scale", json={"replicas": 0})
    wait_for(lambda: ready_count(control_plane, "scaler") == 0, timeout=60, what="0 ready")
    assert (
        api(control_plane, "POST", "/v1/services/scaler/scale", json={"replicas": 9}).status_code
        == 400
    )
    assert api(control_plane, "DELETE", "/v1/services/scaler").status_code == 200
    wait_for(
        lambda: api(control_plane, "GET", "/v1/services/scaler").status_code == 404, what="deletion"
    )


def test_autoscaling_from_zero_up_and_back_to_zero(control_plane):
    spec = sim_service("elastic", replicas=0)
    spec["replicas"] = {"min": 0, "max": 2}
    spec["autoscaling"] = {
        "target_ongoing_requests": 1,
        "upscale_delay_s": 0,
        "downscale_delay_s": 1,
        "scale_to_zero_after_s": 2,
    }
    spec["engine_args"] = {"decode-s-per-token": 0.05}  # streams of ~20 s: room to scale up
    assert api(control_plane, "POST", "/v1/services", json={"spec": spec}).status_code == 201
    assert ready_count(control_plane, "elastic") == 0
    # A request to a service at zero is held while a replica starts.
    r = api(
        control_plane,
        "POST",
        "/v1/completions",
        json={"model": "elastic", "prompt": "wake up", "max_tokens": 2},
    )
    assert r.status_code == 200, r.text
    assert int(r.headers["x-aicluster-cold-start-ms"]) > 0
    # Six concurrent long streams: 6 in flight against a target of 1 -> max replicas.
    client = openai.AsyncOpenAI(
        base_url=control_plane.url + "/v1", api_key=control_plane.admin_token
    )

    async def load():
        async def one(i):
            stream = await client.completions.create(
                model="elastic", prompt=f"load {i}", max_tokens=400, stream=True
            )
            return [c async for c in stream]

        return await asyncio.gather(*(one(i) for i in range(6)))

    import asyncio
    import threading

    results = []
    t = threading.Thread(target=lambda: results.append(asyncio.run(load())))
    t.start()
    wait_for(lambda: ready_count(control_plane, "elastic") == 2, timeout=60, what="scale up to 2")
    t.join(timeout=120)
    assert results and all(len(chunks) > 1 for chunks in results[0])
    # Idle: down to zero replicas after the delays.
    wait_for(
        lambda: (
            ready_count(control_plane, "elastic") == 0
            and not [
                r
                for r in api(control_plane, "GET", "/v1/services/elastic").json()["replicas"]
                if r["status"] in ("PENDING", "STARTING", "READY")
            ]
        ),
        timeout=60,
        what="scale to zero",
    )
    api(control_plane, "DELETE", "/v1/services/elastic")
