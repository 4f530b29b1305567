"""A lean HTTP/1.1 server for gateway processes: the OpenAI POST routes answered straight
from the socket, every other route handed to the gateway's ASGI app.

Why (issue 19, `bench/gateway_overhead.py`, router CPU per request): under uvicorn and
FastAPI a gateway process spent ~620 us of CPU per proxied request against ~260-360 us
for the Rust routers; most of it was per-request machinery (an ASGI task and scope, a
task group per streamed answer, a write per header block, body and terminator). Here a
request is parsed by httptools (the parser uvicorn uses) into plain bytes, handled by the
same `Gateway.forward` as every other front (authentication, limits, routing, errors,
usage), and its answer is written with as few writes as the replica's bytes allow: the
head with the first bytes when they are already there, and the end of a chunked answer
with its last bytes.

Vocabulary:
- hot route: POST /v1/completions, /v1/chat/completions, /v1/embeddings.
- bridged request: any other; it runs through the ASGI app (`app`) with its whole body
  (bounded like a hot route's), as uvicorn would run it.

Invariants:
- Requests on one connection are answered in order, one at a time (pipelined requests
  wait their turn; reading pauses when too many wait).
- A request's body is bounded by `MAX_BODY_BYTES` (413) and its head by `MAX_HEAD_BYTES`
  (431); a malformed request gets a 400 and its connection closes.
- A proxied answer streams as it arrives: bytes already received are written together,
  never held for more -- except a short answer that is not a stream (a known length up to
  `WHOLE_BYTES`, not `text/event-stream`), written once it is whole, in one write with
  its head (its client cannot use a part of it; measured: a write and a client wake-up
  less per request); when the client cannot take more, the replica's connection is not
  read (back-pressure on both sides).
- Whatever ends an exchange (the answer's end, the replica breaking it, the client going
  away), the `Opened` is closed exactly once; a client that goes away closes the
  replica's connection (the engine sees the disconnect).
- Stopping (`serve_forever` returning) lets requests in progress finish for up to
  `DRAIN_S`, then closes every connection.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from http import HTTPStatus
from urllib.parse import unquote

import httptools

from aicluster.gateway import errors
from aicluster.gateway.proxy import MAX_BODY_BYTES, ROUTES, Gateway
from aicluster.gateway.streams import answer_headers
from aicluster.gateway.upstream import ReplicaError

log = logging.getLogger("aicluster.gateway")
MAX_HEAD_BYTES = 64 * 1024
MAX_PIPELINED = 16
KEEP_ALIVE_S = 30.0
DRAIN_S = 10.0
WHOLE_BYTES = 64 * 1024  # a non-streamed answer up to this long is written in one piece
_HOT = {f"/v1/{p}".encode(): p for p in ROUTES}
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


class _Request:
    __slots__ = ("method", "url", "headers", "body", "size", "version", "keep_alive", "too_big")

    def __init__(self) -> None:
        self.method = b""
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.size = 0
        self.version = "1.1"
        self.keep_alive = True
        self.too_big = False

    def header_map(self) -> dict[str, str]:
        return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in self.headers}


class _Conn(asyncio.Protocol):
    """One client connection."""

    def __init__(self, server: LeanServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.req: _Request | None = None
        self.head_bytes = 0
        self.waiting: collections.deque[_Request] = collections.deque()
        self.busy = False
        self.closed = False
        self.last_active = time.monotonic()
        self.lost: asyncio.Future = server.loop.create_future()
        self._drain: asyncio.Future | None = None
        self.reading_paused = False

    # asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport
        self.server.conns.add(self)

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            if self.head_bytes > MAX_HEAD_BYTES:
                self._refuse(431, f"the request's head is larger than {MAX_HEAD_BYTES} bytes")
            else:
                self._refuse(400, f"malformed HTTP request: {exc}")

    def eof_received(self) -> bool:
        """The client closed its side: taken as the client gone (as uvicorn does), so an
        answer in progress stops and the replica sees the disconnect; a client that only
        half-closes its socket after pipelining gets no answer."""
        return False

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.server.conns.discard(self)
        if not self.lost.done():
            self.lost.set_result(None)
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def pause_writing(self) -> None:
        if self._drain is None or self._drain.done():
            self._drain = self.server.loop.create_future()

    def resume_writing(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    async def drain(self) -> None:
        if self._drain is not None and not self._drain.done():
            await self._drain

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.req = _Request()
        self.head_bytes = 0

    def on_url(self, url: bytes) -> None:
        assert self.req is not None
        self.req.url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.req is not None
        self.req.headers.append((name.lower(), value))
        self._count_head(len(name) + len(value))

    def _count_head(self, n: int) -> None:
        self.head_bytes += n
        if self.head_bytes > MAX_HEAD_BYTES:
            raise httptools.HttpParserError("head too large")

    def on_headers_complete(self) -> None:
        req = self.req
        assert req is not None and self.transport is not None
        req.method = self.parser.get_method()
        req.version = self.parser.get_http_version()
        req.keep_alive = self.parser.should_keep_alive()
        length = dict(req.headers).get(b"content-length", b"")
        if length.isdigit() and int(length) > MAX_BODY_BYTES:
            req.too_big = True
        elif dict(req.headers).get(b"expect", b"").lower() == b"100-continue":
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        req = self.req
        assert req is not None
        req.size += len(body)
        if req.size > MAX_BODY_BYTES:
            req.too_big = True
            req.body.clear()
        elif not req.too_big:
            req.body.append(body)

    def on_message_complete(self) -> None:
        req, self.req = self.req, None
        assert req is not None
        self.waiting.append(req)
        if len(self.waiting) > MAX_PIPELINED and self.transport is not None:
            self.transport.pause_reading()
            self.reading_paused = True
        if not self.busy:
            self._next()

    # requests
    def _next(self) -> None:
        if self.closed or not self.waiting:
            return
        req = self.waiting.popleft()
        if self.reading_paused and len(self.waiting) <= MAX_PIPELINED // 2 and self.transport:
            self.transport.resume_reading()
            self.reading_paused = False
        self.busy = True
        task = self.server.loop.create_task(self.server.handle(self, req))
        self.server.tasks.add(task)
        task.add_done_callback(lambda t: self._done(t, req))

    def _done(self, task: asyncio.Task, req: _Request) -> None:
        self.server.tasks.discard(task)
        self.busy = False
        self.last_active = time.monotonic()
        if not task.cancelled() and task.exception() is not None:
            log.error("gateway request failed", exc_info=task.exception())
            self.close()
            return
        if not req.keep_alive or self.server.stopping:
            self.close()
        else:
            self._next()

    def _refuse(self, status: int, message: str) -> None:
        if self.transport is not None and not self.busy:
            resp = errors.openai_error(status, message, "invalid_request_error")
            self.write(head_of(status, resp.raw_headers, close=True) + resp.body)
        self.close()

    def write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()


def head_of(status: int, headers, *, close: bool = False, extra: bytes = b"") -> bytes:
    """A response head: status line, the headers (pairs of bytes), `extra` header lines."""
    parts = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b""))]
    parts += [b"%s: %s\r\n" % (k, v) for k, v in headers]
    if close:
        parts.append(b"connection: close\r\n")
    parts.append(extra)
    parts.append(b"\r\n")
    return b"".join(parts)


class LeanServer:
    """Serves `gateway`'s hot routes and bridges the rest to `app` (ASGI)."""

    def __init__(self, gateway: Gateway, app) -> None:
        self.gw, self.app = gateway, app
        self.loop = asyncio.get_running_loop()
        self.conns: set[_Conn] = set()
        self.tasks: set[asyncio.Task] = set()
        self.stopping = False
        self._server: asyncio.AbstractServer | None = None

    async def start(self, sock, backlog: int) -> None:
        """Serve on `sock`, a listening socket; asyncio listens on it again, with `backlog`
        (left out, its default of 100 would replace the socket's own)."""
        self._server = await self.loop.create_server(
            lambda: _Conn(self), sock=sock, backlog=backlog
        )

    async def serve_until(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set, closing idle keep-alive connections as they expire;
        then drain (see the module's invariants)."""
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 5.0)
            now = time.monotonic()
            for c in list(self.conns):
                if not c.busy and not c.waiting and now - c.last_active > KEEP_ALIVE_S:
                    c.close()
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for c in list(self.conns):
            if not c.busy:
                c.close()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=DRAIN_S)
        for c in list(self.conns):
            c.close()

    async def handle(self, conn: _Conn, req: _Request) -> None:
        path, _, query = req.url.partition(b"?")
        hot = _HOT.get(path) if req.method == b"POST" else None
        if req.too_big:
            resp = errors.too_large(MAX_BODY_BYTES)
            conn.write(head_of(413, resp.raw_headers, close=True) + resp.body)
            req.keep_alive = False
        elif hot is not None:
            await self._hot(conn, req, hot)
        else:
            await self._bridge(conn, req, path, query)

    async def _hot(self, conn: _Conn, req: _Request, path: str) -> None:
        body = req.body[0] if len(req.body) == 1 else b"".join(req.body)

        async def read_body(_limit: int) -> bytes:
            return body

        out = await self.gw.forward(path, req.header_map(), read_body)
        if not isinstance(out, tuple):  # the gateway's error (a Starlette response)
            head = head_of(out.status_code, out.raw_headers, close=not req.keep_alive)
            conn.write(head + out.body)
            return
        opened, observe = out
        up = opened.upstream

        def client_gone(_f) -> None:
            up.abort()

        conn.lost.add_done_callback(client_gone)
        try:
            await self._relay(conn, req, opened, observe)
        finally:
            conn.lost.remove_done_callback(client_gone)
            await opened.close()

    async def _relay(self, conn: _Conn, req: _Request, opened, observe) -> None:
        up = opened.upstream
        headers = [
            (k.encode("latin-1"), v.encode("latin-1")) for k, v in answer_headers(opened).items()
        ]
        length = up.headers.get("content-length")
        if length is not None and not length.isdigit():
            length = None
        streamed = "text/event-stream" in up.headers.get("content-type", "")
        chunked = length is None or "chunked" in up.headers.get("transfer-encoding", "").lower()
        extra = b""
        if not chunked:
            extra += b"content-length: %s\r\n" % length.encode("latin-1")
        elif req.version == "1.1":
            extra += b"transfer-encoding: chunked\r\n"
        else:  # an HTTP/1.0 client: the body ends with the connection
            req.keep_alive, chunked = False, False
        pending = head_of(up.status_code, headers, close=not req.keep_alive, extra=extra)
        first = True
        try:
            if length is not None and not chunked and int(length) <= WHOLE_BYTES and not streamed:
                await up.wait_complete()  # one write for a short answer, head and body
            while True:
                data = up.take()
                if data is not None:
                    if first and data:
                        first = False
                        opened.on_first()
                    observe(data)
                    pending += b"%x\r\n%s\r\n" % (len(data), data) if chunked else data
                    continue
                if up.ended():
                    break
                if pending:  # nothing more yet: what came goes out now, never held
                    conn.write(pending)
                    pending = b""
                    await conn.drain()
                await up.wait()
        except ReplicaError:
            req.keep_alive = False  # the replica broke its answer: so does the client's
            conn.write(pending)
            return
        conn.write(pending + b"0\r\n\r\n" if chunked else pending)

    async def _bridge(self, conn: _Conn, req: _Request, path: bytes, query: bytes) -> None:
        sockname = conn.transport.get_extra_info("sockname") if conn.transport else None
        peer = conn.transport.get_extra_info("peername") if conn.transport else None
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": req.version,
            "server": tuple(sockname[:2]) if sockname else None,
            "client": tuple(peer[:2]) if peer else None,
            "scheme": "http",
            "method": req.method.decode("latin-1"),
            "root_path": "",
            "path": unquote(path.decode("latin-1")),
            "raw_path": path,
            "query_string": query,
            "headers": req.headers,
            "state": {},
        }
        body = b"".join(req.body)
        sent_body = False
        state = {"started": False, "chunked": False, "done": False, "status": 500, "head": []}

        async def receive():
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            await conn.lost
            return {"type": "http.disconnect"}

        async def send(msg):
            if msg["type"] == "http.response.start":
                state["status"], state["head"] = msg["status"], list(msg.get("headers", []))
                names = {k.lower() for k, _ in state["head"]}
                state["chunked"] = b"content-length" not in names and req.version == "1.1"
                if b"content-length" not in names and req.version != "1.1":
                    req.keep_alive = False
                return
            if msg["type"] != "http.response.body" or state["done"]:
                return
            chunk, more = msg.get("body", b""), msg.get("more_body", False)
            out = b""
            if not state["started"]:
                state["started"] = True
                extra = b"transfer-encoding: chunked\r\n" if state["chunked"] else b""
                out = head_of(state["status"], state["head"], close=not req.keep_alive, extra=extra)
            if state["chunked"]:
                out += b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunk else b""
                out += b"" if more else b"0\r\n\r\n"
            else:
                out += chunk
            state["done"] = not more
            conn.write(out)
            await conn.drain()

        try:
            await self.app(scope, receive, send)
        except Exception:
            log.exception("gateway route %s failed", scope["path"])
            if not state["started"]:
                resp = errors.openai_error(500, "internal error", "server_error")
                conn.write(head_of(500, resp.raw_headers, close=True) + resp.body)
            req.keep_alive = False
            return
        if not state["done"]:
            req.keep_alive = False  # the app ended without finishing its answer


__all__ = ["LeanServer", "head_of"]
