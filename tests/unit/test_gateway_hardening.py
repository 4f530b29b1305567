"""The gateway in front of a real simulated engine replica (with its secret), served by
uvicorn (as in the API server) and by the lean server (as in a gateway process) on loopback: body limits, `team/name` models, engines' errors in OpenAI's format,
held requests that time out or lose their service, the OpenAPI description, and retries
(onto another replica before the first byte, never once bytes flowed)."""

from __future__ import annotations

import threading
from contextlib import ExitStack

import httpx
import openai
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse

from aicluster.control.endpoints import Endpoint, EndpointTable, ServiceEndpoints
from aicluster.gateway.proxy import MAX_ATTEMPTS, Gateway
from aicluster.runtime.simulated_core import SimulatedEngineOptions
from aicluster.runtime.simulated_engine import create_app
from aicluster.store.identity import Principal

from asgi_server import serving
from harness import free_port, wait_for
from lean_server import FRONTS, serving_gateway

SECRET = "replica-secret"
TOKENS = {
    "tok-a": Principal("alice", "team-a", "member"),
    "tok-b": Principal("bob", "team-b", "member"),
    "tok-admin": Principal("admin", None, "admin"),
}


def service(url: str | None, secret: str = SECRET, rid: str = "r1") -> ServiceEndpoints:
    reps = (Endpoint(rid, url, secret),) if url else ()
    return ServiceEndpoints("team-a", "chat", "simulated", "least_outstanding", {}, reps, "chat")


@pytest.fixture(scope="module")
def replica():
    with serving(
        create_app(SimulatedEngineOptions(model="chat", time_scale=0.01), secret=SECRET)
    ) as url:
        yield url


@pytest.fixture(params=FRONTS)
def gw(request):
    table = EndpointTable()
    gateway = Gateway(table, TOKENS.get, hold_timeout_s=1.0)
    app = FastAPI()
    app.include_router(gateway.router())
    with serving_gateway(gateway, app, request.param) as url:
        yield table, url


def post(url: str, token: str, path: str = "/v1/completions", **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}", "content-type": "application/json"}
    return httpx.post(url + path, headers=headers, timeout=30, **kw)


def client(url: str, token: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=token, max_retries=0)


def test_deeply_nested_json_is_a_400_naming_the_body(gw):
    table, url = gw
    table.publish({("team-a", "chat"): service(None)})
    r = post(url, "tok-a", content=b"[" * 100_000 + b"]" * 100_000)
    assert r.status_code == 400
    err = r.json()["error"]
    assert "request body" in err["message"] and err["type"] == "invalid_request_error"
    deep = b'{"model": "chat", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert post(url, "tok-a", content=deep).status_code == 400
    assert table.demand("team-a", "chat").ongoing == 0


def test_an_oversized_body_is_a_413(gw):
    _table, url = gw
    r = post(url, "tok-a", content=b" " * (32 * 2**20 + 1))
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"


def test_team_prefixed_model_reaches_the_callers_service(gw, replica):
    table, url = gw
    table.publish({("team-a", "chat"): service(replica)})
    out = client(url, "tok-a").completions.create(model="team-a/chat", prompt="hi", max_tokens=3)
    assert out.choices[0].text and out.model == "chat"
    out = client(url, "tok-admin").completions.create(
        model="team-a/chat", prompt="hi", max_tokens=2
    )
    assert out.choices[0].text
    with pytest.raises(openai.NotFoundError) as exc:  # another team's service: not found
        client(url, "tok-b").completions.create(model="team-a/chat", prompt="hi", max_tokens=2)
    assert exc.value.body["code"] == "model_not_found"
    assert table.demand("team-a", "chat").ongoing == 0


def test_engine_errors_reach_the_client_in_openai_format(gw, replica):
    table, url = gw
    table.publish({("team-a", "chat"): service(replica)})
    r = post(url, "tok-a", "/v1/embeddings", json={"model": "chat", "input": "x"})
    assert r.status_code == 404  # the simulated engine has no embeddings route
    assert r.json() == {
        "error": {"message": "Not Found", "type": "not_found_error", "param": None, "code": None}
    }
    with pytest.raises(openai.BadRequestError) as exc:  # the engine's own 400 keeps its words
        client(url, "tok-a").completions.create(model="chat", prompt="x", max_tokens=0)
    assert "max_tokens" in exc.value.body["message"]
    assert table.demand("team-a", "chat").ongoing == 0


def test_a_replica_that_refuses_the_secret_is_not_a_client_error(gw, replica):
    table, url = gw
    table.publish({("team-a", "chat"): service(replica, secret="stale")})
    r = post(url, "tok-a", json={"model": "chat", "prompt": "x", "max_tokens": 1})
    assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"
    table.publish({("team-a", "chat"): service(replica, rid="r2")})  # r1 is marked failed
    r = post(url, "tok-a", json={"model": "chat", "prompt": "x", "max_tokens": 1})
    assert r.status_code == 200


def test_a_held_request_that_times_out_gets_a_503_and_leaks_nothing(gw):
    table, url = gw
    table.publish({("team-a", "chat"): service(None)})
    with pytest.raises(openai.APIStatusError) as exc:
        client(url, "tok-a").completions.create(model="chat", prompt="x", max_tokens=1)
    assert exc.value.status_code == 503 and exc.value.response.headers["retry-after"]
    assert exc.value.body["type"] == "service_unavailable"
    assert exc.value.body["code"] == "no_replica_in_time"
    d = table.demand("team-a", "chat")
    assert (d.ongoing, d.held, d.waiting_since) == (0, 0, None)


def test_a_request_held_for_a_deleted_service_gets_a_503_and_leaks_nothing(gw):
    table, url = gw
    table.publish({("team-a", "chat"): service(None)})
    answers: list[httpx.Response] = []
    t = threading.Thread(
        target=lambda: answers.append(post(url, "tok-a", json={"model": "chat", "prompt": "x"}))
    )
    t.start()
    wait_for(lambda: table.demand("team-a", "chat").held == 1, timeout=10, what="held request")
    table.publish({})
    t.join(timeout=10)
    assert answers and answers[0].status_code == 503
    assert "deleted" in answers[0].json()["error"]["message"]
    d = table.demand("team-a", "chat")
    assert (d.ongoing, d.held, d.waiting_since) == (0, 0, None)


def test_a_held_request_proceeds_when_a_replica_comes(gw, replica):
    table, url = gw
    table.publish({("team-a", "chat"): service(None)})
    answers: list[httpx.Response] = []
    t = threading.Thread(
        target=lambda: answers.append(
            post(url, "tok-a", json={"model": "chat", "prompt": "x", "max_tokens": 2})
        )
    )
    t.start()
    wait_for(lambda: table.demand("team-a", "chat").held == 1, timeout=10, what="held request")
    table.publish({("team-a", "chat"): service(replica)})
    t.join(timeout=10)
    assert answers[0].status_code == 200 and "x-aicluster-cold-start-ms" in answers[0].headers
    wait_for(lambda: table.demand("team-a", "chat").ongoing == 0, timeout=5, what="finished")
    assert table.demand("team-a", "chat").waiting_since is None


def test_openapi_documents_bodies_and_error_codes(gw):
    _table, url = gw
    doc = httpx.get(url + "/openapi.json").json()
    op = doc["paths"]["/v1/chat/completions"]["post"]
    schema = op["requestBody"]["content"]["application/json"]["schema"]
    assert {"model", "messages"} <= set(schema["required"]) and schema["additionalProperties"]
    assert {"200", "400", "401", "404", "413", "503"} <= set(op["responses"])
    err = op["responses"]["404"]["content"]["application/json"]["schema"]["$ref"]
    assert err.endswith("/OpenAIError")
    assert (
        "prompt"
        in doc["paths"]["/v1/completions"]["post"]["requestBody"]["content"]["application/json"][
            "schema"
        ]["properties"]
    )


# -- retries: before the first byte onto another replica, never once bytes flowed --------


class Replica:
    """A stand-in engine on loopback that answers every completion with `answer()`
    and counts the requests it got."""

    def __init__(self, answer):
        self.hits = 0
        self.app = FastAPI()

        @self.app.post("/v1/completions")
        async def completions():
            self.hits += 1
            return answer()


def _completion():
    return JSONResponse(
        {
            "id": "c1",
            "object": "text_completion",
            "model": "chat",
            "choices": [{"index": 0, "text": "fine"}],
        }
    )


def _cut_stream():
    async def body():
        yield b"data: first\n\n"
        raise RuntimeError("the engine died mid-stream")

    return StreamingResponse(body(), media_type="text/event-stream")


ANSWERS = {
    "good": _completion,
    "broken": lambda: JSONResponse({"detail": "overloaded"}, status_code=503),
    "refusing": lambda: JSONResponse({"error": "max_tokens too large"}, status_code=400),
    "cut": _cut_stream,
}


@pytest.fixture(scope="module")
def replicas():
    """One running replica per kind of answer, shared by the module's tests."""
    with ExitStack() as stack:
        reps = {name: Replica(answer) for name, answer in ANSWERS.items()}
        urls = {name: stack.enter_context(serving(r.app)) for name, r in reps.items()}
        yield reps, urls


@pytest.fixture(params=FRONTS)
def router(replicas, request):
    """The gateway (its object too) in front of `replicas`; `route(*kinds)` publishes
    a service whose replicas are tried in that order."""
    reps, urls = replicas
    for r in reps.values():
        r.hits = 0
    table = EndpointTable()
    gateway = Gateway(table, TOKENS.get, hold_timeout_s=1.0)
    app = FastAPI()
    app.include_router(gateway.router())

    def route(*kinds: str) -> None:
        eps = tuple(
            Endpoint(f"r{i}-{kind}", urls.get(kind, kind), SECRET) for i, kind in enumerate(kinds)
        )
        svc = ServiceEndpoints("team-a", "chat", "simulated", "least_outstanding", {}, eps, "chat")
        table.publish({("team-a", "chat"): svc})
        policy = gateway.policy(svc)
        for rank, ep in enumerate(eps):  # least outstanding first: make the order kinds' order
            for _ in range(rank):
                policy.on_start(ep.replica_id)

    with serving_gateway(gateway, app, request.param) as url:
        yield route, url, reps, table


def _ask(url: str) -> httpx.Response:
    return post(url, "tok-a", json={"model": "chat", "prompt": "x", "max_tokens": 1})


def test_a_5xx_before_the_first_byte_is_retried_on_another_replica(router):
    route, url, reps, table = router
    route("broken", "good")
    r = _ask(url)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "fine"
    assert (reps["broken"].hits, reps["good"].hits) == (1, 1)
    wait_for(lambda: table.demand("team-a", "chat").ongoing == 0, timeout=5, what="finished")


def test_a_replica_that_refuses_connections_is_skipped(router):
    route, url, reps, _table = router
    route(f"http://127.0.0.1:{free_port()}", "good")  # nothing listens there
    assert _ask(url).status_code == 200 and reps["good"].hits == 1


def test_an_engines_own_4xx_is_the_answer_not_a_reason_to_retry(router):
    route, url, reps, _table = router
    route("refusing", "good")
    r = _ask(url)
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
    assert (reps["refusing"].hits, reps["good"].hits) == (1, 0)


def test_no_retry_once_bytes_flowed(router):
    route, url, reps, table = router
    route("cut", "good")
    got = b""
    headers = {"Authorization": "Bearer tok-a"}
    with httpx.stream(
        "POST",
        url + "/v1/completions",
        headers=headers,
        timeout=30,
        json={"model": "chat", "prompt": "x", "stream": True},
    ) as r:
        assert r.status_code == 200
        try:
            for chunk in r.iter_raw():
                got += chunk
        except httpx.HTTPError:
            pass  # the replica's stream broke; the client sees it break too
    assert got == b"data: first\n\n", "exactly what the replica sent, nothing replayed"
    assert (reps["cut"].hits, reps["good"].hits) == (1, 0)
    wait_for(lambda: table.demand("team-a", "chat").ongoing == 0, timeout=5, what="finished")


def test_retries_stop_after_max_attempts(router):
    route, url, reps, _table = router
    route("broken", "broken", "broken", "broken", "good")  # 5 replicas, 4 of them failing
    r = _ask(url)
    assert r.status_code == 503 and "all replicas failed" in r.json()["error"]["message"]
    assert reps["broken"].hits == MAX_ATTEMPTS and reps["good"].hits == 0
