"""The simulated LLM engine: its model (cache, batching, determinism) directly, then the
real server under uvicorn on loopback with httpx and the official `openai` client.

Latency checks read the engine's own reported figures (metrics, usage), never the wall
clock: the server runs 100x faster than simulated time."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import httpx
import openai
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from aicluster.runtime.simulated_core import EngineModel, PrefixKVCache, SimulatedEngineOptions
from aicluster.runtime.simulated_engine import create_app, parse_args

FAST = {
    "time_scale": 0.01,
    "block_size": 4,
    "base_ttft_s": 0.02,
    "prefill_s_per_token": 0.001,
    "decode_s_per_token": 0.01,
}


def words(n: int, tag: str = "w") -> list[str]:
    return [f"{tag}{i}" for i in range(n)]


# -- the model -------------------------------------------------------------------------


def test_ttft_is_base_plus_uncached_prefill_and_cache_hits_cut_it():
    m = EngineModel(
        SimulatedEngineOptions(
            block_size=4, base_ttft_s=0.1, prefill_s_per_token=0.01, decode_s_per_token=0.05
        )
    )
    a = m.admit(0.0, words(40), 3)
    assert a.cached_tokens == 0 and a.ttft == pytest.approx(0.1 + 0.4)
    assert a.finish == pytest.approx(0.5 + 2 * 0.05)
    b = m.admit(10.0, words(40) + words(6, "x"), 3)
    assert b.cached_tokens == 40 and b.ttft == pytest.approx(0.1 + 0.06)
    assert (m.counters.prefix_hits, m.counters.prefix_queries) == (40, 86)


def test_output_blocks_are_cached_for_the_next_turn():
    m = EngineModel(SimulatedEngineOptions(block_size=4))
    prompt = words(8)
    answer = m.output_tokens(prompt, 8)
    m.admit(0.0, prompt, 8)
    nxt = m.admit(1.0, prompt + answer + ["more"], 4)
    assert nxt.cached_tokens == 16


def test_requests_beyond_the_concurrency_limit_wait_in_arrival_order():
    m = EngineModel(
        SimulatedEngineOptions(
            max_concurrency=2, base_ttft_s=1.0, prefill_s_per_token=0, decode_s_per_token=1.0
        )
    )
    plans = [m.admit(0.0, words(2, str(i)), 2) for i in range(4)]  # each runs 2 s
    assert [p.start for p in plans] == [0.0, 0.0, 2.0, 2.0]
    assert plans[2].ttft == pytest.approx(3.0)
    assert m.counts(1.0) == (2, 2)
    assert m.counts(2.5) == (0, 2)
    assert m.counts(4.0) == (0, 0)


def test_lru_cache_keeps_its_capacity_and_evicts_leaves_first():
    cache = PrefixKVCache(capacity_blocks=3)
    cache.insert([1, 2, 3])
    cache.insert([4])
    assert len(cache) == 3 and 3 not in cache and cache.matched_blocks([1, 2, 3]) == 2
    assert cache.usage == 1.0


def test_same_arrivals_give_the_same_plans_and_text():
    def run():
        m = EngineModel(SimulatedEngineOptions(seed=3, max_concurrency=3, block_size=2))
        arrivals = [(0.01 * i, words(i % 7 + 1, str(i % 3)), i % 4 + 1) for i in range(40)]
        plans = [m.admit(t, p, n) for t, p, n in arrivals]
        return plans, [m.output_tokens(p, n) for _, p, n in arrivals], m.counters

    assert run() == run()
    m = EngineModel(SimulatedEngineOptions(seed=4))
    assert m.output_tokens(words(5), 6) != run()[1][4]


def test_cli_flags_map_to_options():
    host, port, o = parse_args(
        ["--port", "9001", "--block-size", "8", "--model", "m", "--time-scale", "0.5"]
    )
    assert (host, port) == ("127.0.0.1", 9001)
    assert (o.block_size, o.model, o.time_scale) == (8, "m", 0.5)


# -- the server ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[str, object]]:
    """A real uvicorn server on a loopback socket bound before it starts (the listen
    backlog holds early connections, so no readiness polling is needed)."""
    app = create_app(SimulatedEngineOptions(model="sim-model", **FAST))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", app.state.engine
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()


def metric(url: str, name: str, suffix: str = "") -> float:
    text = httpx.get(url + "/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name + suffix and sample.labels.get("model_name") == "sim-model":
                return sample.value
    raise AssertionError(f"{name}{suffix} not in /metrics")


def test_models_health_and_metrics_are_served(engine):
    url, _ = engine
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == "sim-model"
    text = httpx.get(url + "/metrics").text
    for name in (
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:gpu_cache_usage_perc",
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_queries_total",
        "vllm:time_to_first_token_seconds_bucket",
    ):
        assert name + "{" in text


def test_openai_client_completion_and_chat(engine):
    url, _ = engine
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    c = client.completions.create(model="sim-model", prompt="hello there world", max_tokens=5)
    assert len(c.choices[0].text.split()) == 5 and c.usage.completion_tokens == 5
    again = client.completions.create(model="sim-model", prompt="hello there world", max_tokens=5)
    assert again.choices[0].text == c.choices[0].text  # deterministic text
    chat = client.chat.completions.create(
        model="sim-model",
        max_tokens=4,
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
    )
    assert chat.choices[0].message.role == "assistant"
    assert len(chat.choices[0].message.content.split()) == 4


def test_openai_client_streams_chat_and_completions(engine):
    url, _ = engine
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    stream = client.chat.completions.create(
        model="sim-model",
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "tell me a story"}],
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 6
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 6
    full = client.chat.completions.create(
        model="sim-model", max_tokens=6, messages=[{"role": "user", "content": "tell me a story"}]
    )
    assert full.choices[0].message.content == text
    pieces = [
        c.choices[0].text
        for c in client.completions.create(
            model="sim-model", prompt="abc", max_tokens=3, stream=True
        )
    ]
    assert len("".join(pieces).split()) == 3


def test_raw_sse_ends_with_done(engine):
    url, _ = engine
    body = {"model": "sim-model", "prompt": "x y z", "max_tokens": 2, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]" and len(events) == 3


def test_repeated_prefix_raises_hits_and_lowers_reported_ttft(engine):
    url, _ = engine
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    prompt = " ".join(words(200, "ctx"))

    def ttft_of_one(text: str) -> tuple[float, int]:
        before = metric(url, "vllm:time_to_first_token_seconds", "_sum")
        r = client.completions.create(model="sim-model", prompt=text, max_tokens=2)
        after = metric(url, "vllm:time_to_first_token_seconds", "_sum")
        return after - before, r.usage.prompt_tokens_details.cached_tokens

    hits0 = metric(url, "vllm:prefix_cache_hits_total")
    cold, cold_cached = ttft_of_one(prompt + " first question")
    warm, warm_cached = ttft_of_one(prompt + " second question")
    assert cold_cached == 0 and warm_cached == 200
    assert metric(url, "vllm:prefix_cache_hits_total") - hits0 == 200
    assert warm < cold
    assert cold == pytest.approx(0.02 + 0.001 * 202, abs=1e-6)  # no queueing here
    assert metric(url, "vllm:gpu_cache_usage_perc") > 0


def test_errors_come_back_in_openai_format(engine):
    url, _ = engine
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=1)
    r = httpx.post(url + "/v1/chat/completions", json={"model": "sim-model", "messages": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = httpx.post(url + "/v1/completions", content=b"{", headers={"content-type": "x"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]


def test_peer_router_probes_answer(engine):
    url, _ = engine
    for path in ("/version", "/server_info", "/get_model_info", "/loads", "/health_generate"):
        assert httpx.get(url + path).status_code == 200, path
    tok = httpx.post(url + "/tokenize", json={"prompt": "a b c"}).json()
    assert tok["count"] == 3


def test_a_chat_turn_reuses_the_cache_of_the_previous_turn(engine):
    url, _ = engine
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    history = [{"role": "user", "content": " ".join(words(30, "turn"))}]
    one = client.chat.completions.create(model="sim-model", max_tokens=8, messages=history)
    history += [
        {"role": "assistant", "content": one.choices[0].message.content},
        {"role": "user", "content": "and then?"},
    ]
    two = client.chat.completions.create(model="sim-model", max_tokens=8, messages=history)
    prior = one.usage.prompt_tokens + one.usage.completion_tokens
    assert two.usage.prompt_tokens_details.cached_tokens == prior // 4 * 4  # full blocks
