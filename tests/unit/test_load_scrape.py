"""Engine load scraped from replicas' `/metrics` (gateway.load) and what routing makes of
it: two real simulated engine replicas on loopback, one of them kept busy by another
client (not this gateway); the scrape sees it and least-load routing avoids it."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import httpx
import pytest

from aicluster.control.endpoints import Endpoint, EndpointTable, ServiceEndpoints
from aicluster.core.routing import ReplicaState, RouteRequest, make_policy
from aicluster.gateway.load import LoadScraper, parse_metrics
from aicluster.runtime.simulated_core import SimulatedEngineOptions
from aicluster.runtime.simulated_engine import create_app

from asgi_server import serving
from harness import wait_for

SECRET = "s3cret"


@pytest.fixture(scope="module")
def replicas():
    opts = SimulatedEngineOptions(model="chat", time_scale=1.0, decode_s_per_token=0.05)
    with (
        serving(create_app(opts, secret=SECRET)) as a,
        serving(create_app(opts, secret=SECRET)) as b,
    ):
        yield a, b


def test_parse_metrics_reads_vllm_and_tgi_names():
    text = (
        "# HELP vllm:num_requests_running Requests in the running batch.\n"
        'vllm:num_requests_running{model_name="m"} 3.0\n'
        'vllm:num_requests_waiting{model_name="m"} 2.0 1700000000000\n'
        'vllm:kv_cache_usage_perc{model_name="m"} 0.5\n'
        'vllm:num_requests_running_other{model_name="m"} 9.0\n'
    )
    assert parse_metrics(text) == (3.0, 2.0, 0.5)
    assert parse_metrics("tgi_batch_current_size 4\ntgi_queue_size 1\n") == (4.0, 1.0, 0.0)
    assert parse_metrics("up 1\n") is None
    assert parse_metrics('vllm:num_requests_running{a="b"} NaN\n') is None


def test_a_replica_busy_with_another_clients_requests_is_avoided(replicas):
    a, b = replicas
    table = EndpointTable()
    reps = (Endpoint("a", a, SECRET), Endpoint("b", b, SECRET))
    ep = ServiceEndpoints("t", "chat", "simulated", "least_outstanding", {}, reps, "chat")
    table.publish({("t", "chat"): ep})
    # Another client (another gateway, say) keeps 3 long requests running on replica a.
    stop = threading.Event()

    def busy():
        headers = {"X-Aicluster-Replica-Secret": SECRET}
        body = {"model": "chat", "prompt": "x", "max_tokens": 400, "stream": True}
        with (
            httpx.Client(timeout=60) as c,
            c.stream("POST", a + "/v1/completions", json=body, headers=headers) as r,
        ):
            for _ in r.iter_bytes():
                if stop.is_set():
                    return

    threads = [threading.Thread(target=busy) for _ in range(3)]
    for t in threads:
        t.start()
    policy = make_policy("least_outstanding")

    async def scrape() -> list[ReplicaState]:
        async with httpx.AsyncClient() as client:
            scraper = LoadScraper(
                table, lambda: client, lambda *_: policy.outstanding("a"), interval_s=1.0
            )
            await scraper.scrape_once()
            return scraper.states(ep)

    try:
        states = wait_for(
            lambda: (s := asyncio.run(scrape())) and s[0].reported_load == 3 and s,
            timeout=10,
            what="a scrape that sees 3 running on a",
        )
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert states[1].reported_load == 0
    route = RouteRequest(now=0.0)
    # Without the scrape both replicas look idle and the first choice alternates; with it,
    # every choice is b until b carries this gateway's 3 requests.
    picks = []
    for _ in range(3):
        rid = policy.choose_replicas(route, states)[0]
        policy.on_start(rid, route)
        picks.append(rid)
    assert picks == ["b", "b", "b"]


def test_the_gateway_scrapes_its_replicas_in_the_background(replicas):
    from fastapi import FastAPI

    from aicluster.gateway.proxy import Gateway
    from aicluster.store.identity import Principal

    a, b = replicas
    table = EndpointTable()
    reps = (Endpoint("a", a, SECRET), Endpoint("b", b, SECRET))
    ep = ServiceEndpoints("t", "chat", "simulated", "least_outstanding", {}, reps, "chat")
    table.publish({("t", "chat"): ep})
    gateway = Gateway(table, {"tok": Principal("u", "t", "member")}.get, scrape_interval_s=0.2)
    app = FastAPI()
    app.include_router(gateway.router())
    with serving(app) as url:
        r = httpx.post(
            url + "/v1/completions",
            json={"model": "chat", "prompt": "hi", "max_tokens": 2},
            headers={"Authorization": "Bearer tok"},
        )
        assert r.status_code == 200
        wait_for(lambda: set(gateway.loads.reports) == {"a", "b"}, timeout=10, what="scrapes")
        table.publish({("t", "chat"): dataclasses.replace(ep, replicas=())})
        wait_for(lambda: not gateway.loads.reports, timeout=10, what="reports of gone replicas")


def test_engine_series_are_read_by_short_name_and_summed_over_label_sets():
    from aicluster.gateway.load import engine_series

    text = (
        "# HELP vllm:num_requests_running x\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 1.0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 40.0\n'
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 30.0\n'
        'vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.7e9\n'
        "vllm:num_requests_waiting NaN\n"
        "other_series 5\n"
    )
    assert engine_series(text) == {
        "requests_running": 3.0,
        "kv_cache_usage": 0.25,
        "prefix_cache_queries": 40.0,
        "prefix_cache_hits": 30.0,
    }
