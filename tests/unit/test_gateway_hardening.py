"""The gateway in front of a real simulated engine replica (with its secret), served by
uvicorn on loopback: body limits, `team/name` models, engines' errors in OpenAI's format,
held requests that time out or lose their service, and the OpenAPI description."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest
from fastapi import FastAPI

from aicluster.control.endpoints import Endpoint, EndpointTable, ServiceEndpoints
from aicluster.gateway.proxy import Gateway
from aicluster.runtime.simulated_core import SimulatedEngineOptions
from aicluster.runtime.simulated_engine import create_app
from aicluster.store.db import Principal
from asgi_server import serving
from harness import wait_for

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
    with serving(create_app(SimulatedEngineOptions(model="chat", time_scale=0.01),
                            secret=SECRET)) as url:  # fmt: skip
        yield url


@pytest.fixture()
def gw():
    table = EndpointTable()
    gateway = Gateway(table, TOKENS.get, hold_timeout_s=1.0)
    app = FastAPI()
    app.include_router(gateway.router())
    with serving(app) as url:
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
    out = client(url, "tok-admin").completions.create(model="team-a/chat", prompt="hi",
                                                      max_tokens=2)  # fmt: skip
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
    assert r.json() == {"error": {"message": "Not Found", "type": "not_found_error",
                                  "param": None, "code": None}}  # fmt: skip
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


def test_a_held_request_that_times_out_gets_a_504_and_leaks_nothing(gw):
    table, url = gw
    table.publish({("team-a", "chat"): service(None)})
    with pytest.raises(openai.APIStatusError) as exc:
        client(url, "tok-a").completions.create(model="chat", prompt="x", max_tokens=1)
    assert exc.value.status_code == 504
    assert exc.value.body["type"] == "service_unavailable"
    d = table.demand("team-a", "chat")
    assert (d.ongoing, d.held, d.waiting_since) == (0, 0, None)


def test_a_request_held_for_a_deleted_service_gets_a_503_and_leaks_nothing(gw):
    table, url = gw
    table.publish({("team-a", "chat"): service(None)})
    answers: list[httpx.Response] = []
    t = threading.Thread(target=lambda: answers.append(
        post(url, "tok-a", json={"model": "chat", "prompt": "x"})))  # fmt: skip
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
    t = threading.Thread(target=lambda: answers.append(
        post(url, "tok-a", json={"model": "chat", "prompt": "x", "max_tokens": 2})))  # fmt: skip
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
    assert {"200", "400", "401", "404", "413", "503", "504"} <= set(op["responses"])
    err = op["responses"]["404"]["content"]["application/json"]["schema"]["$ref"]
    assert err.endswith("/OpenAIError")
    assert "prompt" in doc["paths"]["/v1/completions"]["post"]["requestBody"]["content"][
        "application/json"]["schema"]["properties"]
