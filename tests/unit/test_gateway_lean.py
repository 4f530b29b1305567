"""The gateway's hot path of its own (issue 19): the keep-alive client to replicas
(gateway.upstream) against real servers on loopback, including rude ones, and the lean
HTTP server (gateway.httpserver) against raw clients: malformed, oversized, pipelined and
HTTP/1.0 requests, streams that pass through unheld, clients that leave mid-stream."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import threading
from contextlib import contextmanager

import httpx
import openai
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from aicluster.control.endpoints import Endpoint, EndpointTable, ServiceEndpoints
from aicluster.gateway.process import BACKLOG
from aicluster.gateway.proxy import Gateway
from aicluster.gateway.upstream import Pool, ReplicaError
from aicluster.runtime.simulated_core import SimulatedEngineOptions
from aicluster.runtime.simulated_engine import create_app
from aicluster.store.identity import Principal

from asgi_server import serving
from harness import free_port, wait_for
from lean_server import serving_lean

TOKENS = {"tok-a": Principal("alice", "team-a", "member")}
AUTH = {"Authorization": "Bearer tok-a"}


# -- gateway.upstream ----------------------------------------------------------------------


async def _raw_server(answer: bytes, close_after: bool):
    """A replica that reads a request head and answers `answer` (raw bytes), then closes
    the connection when `close_after`, without saying so."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                writer.write(answer)
                await writer.drain()
                if close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


def test_connections_are_kept_alive_and_reused():
    with serving(create_app(SimulatedEngineOptions(model="m", time_scale=0.001))) as url:

        async def run():
            pool = Pool()
            for i in range(20):
                body = b'{"model": "m", "prompt": "hi %d", "max_tokens": 2}' % i
                answer = await pool.request(
                    "POST", url + "/v1/completions", body, {"content-type": "application/json"}
                )
                assert answer.status_code == 200
                assert b'"text_completion"' in await answer.aread()
            opened, idle = pool.opened, pool.idle()
            await pool.aclose()
            return opened, idle

        assert asyncio.run(run()) == (1, 1)


def test_a_connection_the_replica_closed_while_idle_is_replaced_without_an_error():
    ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"

    async def run():
        server, url = await _raw_server(ok, close_after=True)
        pool = Pool()
        got = []
        for _ in range(3):
            answer = await pool.request("POST", url + "/x", b"{}")
            got.append(await answer.aread())
            await asyncio.sleep(0)  # let the replica's close arrive
        server.close()
        return got, pool.opened

    got, opened = asyncio.run(run())
    assert got == [b"ok"] * 3 and opened == 3


def test_chunked_and_until_close_bodies_arrive_whole():
    chunked = (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    )
    until_close = b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nthe rest"

    async def run():
        out = []
        for raw, close in ((chunked, False), (until_close, True)):
            server, url = await _raw_server(raw, close_after=close)
            pool = Pool()
            answer = await pool.request("POST", url + "/x", b"{}")
            out.append(await answer.aread())
            server.close()
            await pool.aclose()
        return out

    assert asyncio.run(run()) == [b"abcde", b"the rest"]


def test_an_answer_broken_in_the_middle_is_an_error_not_a_short_body():
    cut = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly ten b"

    async def run():
        server, url = await _raw_server(cut, close_after=True)
        pool = Pool()
        answer = await pool.request("POST", url + "/x", b"{}")
        try:
            with pytest.raises(ReplicaError, match="middle of its answer"):
                await answer.aread()
        finally:
            server.close()
        return pool.idle()

    assert asyncio.run(run()) == 0  # a broken connection never goes back to the pool


def test_a_replica_that_is_not_there_is_a_replica_error():
    async def run():
        with pytest.raises(ReplicaError, match="cannot connect"):
            await Pool().request("POST", f"http://127.0.0.1:{free_port()}/x", b"{}")

    asyncio.run(run())


def test_a_header_with_a_line_break_is_refused_before_anything_is_sent():
    async def run():
        with pytest.raises(ReplicaError, match="line break"):
            await Pool().request("POST", "http://127.0.0.1:1/x", b"", {"x": "a\r\nevil: 1"})

    asyncio.run(run())


# -- gateway.httpserver ----------------------------------------------------------------------


class Paced:
    """A replica whose stream sends its first event, then waits for `go` before the rest:
    a client that sees the first event while the replica waits proves nothing is held."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.finished = threading.Event()
        self.app = FastAPI()

        @self.app.post("/v1/completions")
        async def completions():
            async def body():
                try:
                    yield b'data: {"choices": [{"index": 0, "text": "first"}]}\n\n'
                    await asyncio.to_thread(self.go.wait, 20)
                    yield b'data: {"choices": [{"index": 0, "text": " second"}]}\n\n'
                    yield b"data: [DONE]\n\n"
                finally:
                    self.finished.set()

            return StreamingResponse(body(), media_type="text/event-stream")


@pytest.fixture(scope="module")
def engine():
    with serving(create_app(SimulatedEngineOptions(model="chat", time_scale=0.01))) as url:
        yield url


@pytest.fixture()
def lean(engine):
    """(table, url): the lean server over a gateway whose service `chat` has one replica."""
    table = EndpointTable()
    gateway = Gateway(table, TOKENS.get, hold_timeout_s=1.0, scrape_interval_s=None)
    app = FastAPI()
    app.include_router(gateway.router())

    @app.get("/healthz")
    def healthz():
        return {"ok": True}

    publish(table, engine)
    with serving_lean(gateway, app) as url:
        yield table, url


def publish(table: EndpointTable, url: str) -> None:
    eps = (Endpoint("r1", url, ""),)
    svc = ServiceEndpoints("team-a", "chat", "simulated", "least_outstanding", {}, eps, "chat")
    table.publish({("team-a", "chat"): svc})


def _exchange(url: str, raw: bytes, timeout: float = 10.0) -> bytes:
    """Send raw bytes, read until the server closes the connection (a client that closes
    its own side is taken as gone: it must not)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(raw)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def _completion_request(version: str = "1.1", close: bool = False) -> bytes:
    body = b'{"model": "chat", "prompt": "hi", "max_tokens": 2}'
    head = (
        f"POST /v1/completions HTTP/{version}\r\nhost: x\r\nauthorization: Bearer tok-a\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
    )
    if close:
        head += "connection: close\r\n"
    return head.encode() + b"\r\n" + body


def test_the_official_client_works_through_the_lean_server(lean):
    _table, url = lean
    client = openai.OpenAI(base_url=url + "/v1", api_key="tok-a", max_retries=0)
    done = client.completions.create(model="chat", prompt="hello", max_tokens=3)
    assert done.choices[0].text and done.usage.completion_tokens == 3
    stream = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
    )
    pieces = [c.choices[0].delta.content for c in stream if c.choices]
    assert len([p for p in pieces if p]) == 4


def test_bridged_routes_reach_the_app(lean):
    _table, url = lean
    assert httpx.get(url + "/healthz").json() == {"ok": True}
    models = httpx.get(url + "/v1/models", headers=AUTH).json()
    assert [m["id"] for m in models["data"]] == ["chat"]
    assert httpx.get(url + "/v1/models").status_code == 401
    assert httpx.get(url + "/nowhere").status_code == 404


def test_pipelined_requests_are_answered_in_order(lean):
    _table, url = lean
    raw = _exchange(url, _completion_request() + _completion_request(close=True))
    assert raw.count(b"HTTP/1.1 200 OK") == 2
    assert raw.count(b'"text_completion"') == 2


def test_an_http_1_0_client_gets_its_answer_and_the_connection_closes(lean):
    _table, url = lean
    raw = _exchange(url, _completion_request(version="1.0"))
    assert raw.startswith(b"HTTP/1.1 200 OK") and raw.rstrip().endswith(b"}")
    assert b"transfer-encoding" not in raw.lower()


def test_malformed_and_oversized_heads_get_4xx_and_a_closed_connection(lean):
    _table, url = lean
    bad = _exchange(url, b"POST /v1/completions HTTP/1.1\r\ncontent-length: x\r\n\r\n")
    assert bad.startswith(b"HTTP/1.1 400") and b"malformed HTTP request" in bad
    huge = b"GET /healthz HTTP/1.1\r\nconnection: close\r\nx-big: " + b"a" * 70_000 + b"\r\n\r\n"
    big = _exchange(url, huge)
    assert big.startswith(b"HTTP/1.1 431") and b"larger than 65536 bytes" in big
    assert httpx.get(url + "/healthz").status_code == 200  # the server goes on


@contextmanager
def first_event(lean, replica: str):
    """The lines of a streamed completion through the lean server to `replica`, once its
    first event arrived."""
    table, url = lean
    publish(table, replica)
    body = {"model": "chat", "prompt": "x", "max_tokens": 2, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, headers=AUTH) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line)
        assert first == 'data: {"choices": [{"index": 0, "text": "first"}]}'
        yield lines


def test_a_stream_passes_each_event_as_it_comes(lean):
    paced = Paced()
    with serving(paced.app) as replica, first_event(lean, replica) as lines:
        assert not paced.finished.is_set()  # the replica is still waiting for `go`
        paced.go.set()
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]"


def test_a_client_that_leaves_mid_stream_frees_the_request_and_the_replica(lean):
    table, _url = lean
    paced = Paced()
    with serving(paced.app) as replica:
        with first_event(lean, replica):
            assert table.demand("team-a", "chat").ongoing == 1
        # the client closed its connection without reading on
        wait_for(lambda: table.demand("team-a", "chat").ongoing == 0, timeout=5, what="freed")
        paced.go.set()
        wait_for(paced.finished.is_set, timeout=10, what="the replica's stream ended")


def _listen_backlog(port: int) -> int:
    """The backlog the kernel holds for the socket listening on `port` (`ss`'s Send-Q)."""
    out = subprocess.run(
        ["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout.split()
    return int(out[2])


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_the_server_listens_with_the_gateway_backlog_not_asyncios_default(lean):
    # asyncio's create_server(sock=...) listens again with backlog 100 unless told: 1,000
    # clients connecting at once then saw their connections reset (the soak's ReadErrors).
    _table, url = lean
    assert _listen_backlog(int(url.rsplit(":", 1)[1])) == BACKLOG == 2048
