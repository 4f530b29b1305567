"""The gateway in the real control plane, on the session Ray cluster, with `simulated`
replicas and the official `openai` client: requests held for a cold start that time out
or lose their service (an OpenAI 503, the in-flight count released, scale-to-zero still
happening), and both spellings of a model (`NAME`, `TEAM/NAME`) reaching the engine."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest

from harness import wait_for

pytestmark = pytest.mark.ray


def api(cp, method: str, path: str, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {cp.admin_token}"}
    return httpx.request(method, cp.url + path, headers=headers, timeout=30, **kw)


def cold_service(name: str, startup_s: float, hold_s: float, idle_s: float = 2) -> dict:
    """A service at zero whose replica loads for `startup_s`; requests wait `hold_s`;
    idle for `idle_s`, it goes back to zero."""
    return {
        "kind": "service",
        "name": name,
        "model": "sim-model",
        "engine": "simulated",
        "resources": {"cpus": 0.5},
        "replicas": {"min": 0, "max": 1},
        "engine_args": {"startup-s": startup_s, "time-scale": 0.05},
        "routing": {"policy": "least_outstanding", "options": {"hold_timeout_s": hold_s}},
        "autoscaling": {
            "upscale_delay_s": 0,
            "downscale_delay_s": 1,
            "scale_to_zero_after_s": idle_s,
        },
        "readiness_timeout_s": 120,
    }


def service(cp, name: str) -> dict:
    return api(cp, "GET", f"/v1/services/{name}").json()


def live_replicas(cp, name: str) -> list[dict]:
    return [
        r for r in service(cp, name)["replicas"] if r["status"] in ("PENDING", "STARTING", "READY")
    ]


def client(cp) -> openai.OpenAI:
    return openai.OpenAI(base_url=cp.url + "/v1", api_key=cp.admin_token, max_retries=0)


def test_a_held_request_that_times_out_gets_a_503_and_scale_to_zero_still_happens(
    control_plane,
):
    cp = control_plane
    r = api(cp, "POST", "/v1/services", json={"spec": cold_service("slowstart", 3, 1.5, idle_s=15)})
    assert r.status_code == 201, r.text
    try:
        with pytest.raises(openai.APIStatusError) as exc:
            client(cp).completions.create(model="slowstart", prompt="wake up", max_tokens=2)
        assert exc.value.status_code == 503
        assert exc.value.body["code"] == "no_replica_in_time"
        assert exc.value.body["type"] == "service_unavailable"
        assert "1.5 s" in exc.value.body["message"]
        assert int(exc.value.response.headers["retry-after"]) > 0
        assert service(cp, "slowstart")["ongoing_requests"] == 0  # released, not leaked
        # The held request woke the service: its replica comes up after its cold start
        # (and before the service has been idle for 15 s) ...
        wait_for(lambda: service(cp, "slowstart")["ready"] == 1, timeout=90, what="1 ready")
        out = client(cp).completions.create(model="slowstart", prompt="now", max_tokens=2)
        assert out.choices[0].text
        # ... and, idle again, the service goes back to zero.
        wait_for(lambda: not live_replicas(cp, "slowstart"), timeout=60, what="scale to zero")
        assert service(cp, "slowstart")["ongoing_requests"] == 0
    finally:
        api(cp, "DELETE", "/v1/services/slowstart")


def test_a_request_held_for_a_deleted_service_gets_a_503(control_plane):
    cp = control_plane
    r = api(cp, "POST", "/v1/services", json={"spec": cold_service("doomed", 60, 120)})
    assert r.status_code == 201, r.text
    errors: list[openai.APIStatusError] = []

    def call():
        try:
            client(cp).completions.create(model="doomed", prompt="x", max_tokens=1)
        except openai.APIStatusError as e:
            errors.append(e)

    t = threading.Thread(target=call)
    t.start()
    try:
        wait_for(lambda: service(cp, "doomed")["ongoing_requests"] == 1, what="a held request")
    finally:
        assert api(cp, "DELETE", "/v1/services/doomed").status_code == 200
    t.join(timeout=60)
    assert not t.is_alive() and errors
    assert errors[0].status_code == 503
    assert errors[0].body["code"] == "no_replica"
    assert "deleted" in errors[0].body["message"]


@pytest.fixture(scope="module")
def named(control_plane):
    spec = {
        "kind": "service",
        "name": "named",
        "model": "sim-model",
        "engine": "simulated",
        "resources": {"cpus": 0.5},
        "replicas": {"min": 1, "max": 1},
        "engine_args": {"time-scale": 0.05},
    }
    r = api(control_plane, "POST", "/v1/services", json={"spec": spec})
    assert r.status_code == 201, r.text
    wait_for(lambda: service(control_plane, "named")["ready"] == 1, timeout=90, what="1 ready")
    yield "named"
    api(control_plane, "DELETE", "/v1/services/named")


@pytest.mark.parametrize("model", ["named", "default/named"])
def test_both_model_spellings_reach_the_engine_as_the_name_it_serves(control_plane, named, model):
    c = client(control_plane)
    out = c.completions.create(model=model, prompt="hello", max_tokens=3)
    assert out.choices[0].text and out.model == "named"
    chat = c.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert chat.choices[0].message.content and chat.model == "named"
    stream = c.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "stream"}], max_tokens=4, stream=True
    )
    pieces = [ch.choices[0].delta.content for ch in stream if ch.choices]
    assert "".join(p for p in pieces if p)


def test_invalid_routing_options_are_refused_at_deploy_naming_the_option(control_plane):
    spec = cold_service("badopts", 0, 1)
    spec["routing"]["options"] = {"hold_timeout_s": -1, "blok_size": 3}
    r = api(control_plane, "POST", "/v1/services", json={"spec": spec})
    assert 400 <= r.status_code < 500, r.text
    assert "routing.options.hold_timeout_s" in r.text and "routing.options.blok_size" in r.text
    assert api(control_plane, "GET", "/v1/services/badopts").status_code == 404
