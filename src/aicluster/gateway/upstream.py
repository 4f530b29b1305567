"""The gateway's client to replicas: HTTP/1.1 keep-alive connections on asyncio, parsed
with httptools (the parser uvicorn uses), and nothing else on the hot path.

Why not httpx: measured with `bench/upstream_clients.py` (one zero-cost replica, the same
request), httpx spends several times the CPU per request of a plain keep-alive
connection; it was the largest part of what the gateway added (issue 19). The pool keeps
only what the gateway needs: POST/GET with a body, a status and headers, the body as it
arrives, keep-alive reuse.

Vocabulary:
- pool: idle connections per (host, port), reused newest first (the warmest).
- answer: an `Answer` -- status, lower-cased headers, and the body as chunks (chunked
  transfer coding removed, nothing else decoded: the gateway asks for identity encoding).

Invariants:
- A connection goes back to the pool only when its answer was read to the end and both
  sides keep it alive; any other end (closed early, broken, `Connection: close`) closes
  it. A connection is never shared by two requests at once.
- A request sent on a reused connection that the replica had closed meanwhile (no byte
  of an answer came back) is sent once more on a new connection; any other failure is an
  `ReplicaError` to the caller, raised before the answer (connect, refused, closed
  early) or from the body's iterator (broken mid-answer).
- Reading is paused while more than `HIGH_WATER` bytes of an answer wait for the gateway's
  client, so a slow client never makes the gateway buffer a whole answer.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Mapping
from urllib.parse import urlsplit

import httptools

CONNECT_TIMEOUT_S = 2.0
MAX_IDLE_PER_HOST = 128
HIGH_WATER = 1 << 20
LOW_WATER = 1 << 18


class ReplicaError(Exception):
    """The replica could not be reached, or broke its answer."""


class Headers(dict):
    """Lower-cased header names to values (the last one wins, as the gateway reads them)."""

    def get(self, key: str, default=None):  # type: ignore[override]
        return super().get(key.lower(), default)


class _Conn(asyncio.Protocol):
    """One keep-alive connection; at most one answer in flight."""

    def __init__(self, key: tuple[str, int]) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self._answer: Answer | None = None
        self._parser = None

    # asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self._answer is None or self._parser is None:  # nothing asked: a broken replica
            self.abort()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ReplicaError(f"bad answer from the replica: {exc}"))
            self.abort()

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self._answer is not None:
            self._answer._lost(exc)

    def pause_writing(self) -> None:  # the request body is sent in one write; nothing to do
        pass

    def resume_writing(self) -> None:
        pass

    # one request
    def start(self, answer: Answer) -> None:
        self._answer = answer
        self._parser = httptools.HttpResponseParser(answer)
        answer._conn = self

    def finish(self) -> None:
        self._answer, self._parser = None, None

    def _fail(self, exc: Exception) -> None:
        if self._answer is not None:
            self._answer._error(exc)

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def reusable(self) -> bool:
        return not self.closed and self.transport is not None and not self.transport.is_closing()


class Answer:
    """A replica's answer, from its status line on. httptools calls the `on_*` methods."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._conn: _Conn | None = None
        self.status_code = 0
        self.headers = Headers()
        self._head: asyncio.Future = asyncio.get_running_loop().create_future()
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._wake: asyncio.Future | None = None
        self._complete = False
        self._exc: Exception | None = None
        self._until_eof = False  # neither a length nor chunked: the body ends with the connection
        self._released = False
        self.got_bytes = False
        self.keep_alive = False

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.got_bytes = True

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        assert self._conn is not None and self._conn._parser is not None
        self.status_code = self._conn._parser.get_status_code()
        self.keep_alive = self._conn._parser.should_keep_alive()  # known here, not at the end
        te = self.headers.get("transfer-encoding", "")
        self._until_eof = "content-length" not in self.headers and "chunked" not in te.lower()
        if not self._head.done():
            self._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._paused and self._conn is not None:
            self._paused = True
            if self._conn.transport is not None:
                self._conn.transport.pause_reading()
        self._notify()

    def on_message_complete(self) -> None:
        self._complete = True
        self._notify()

    # from the connection
    def _lost(self, exc) -> None:
        if self._complete:
            return
        if self._head.done() and self._until_eof and exc is None:
            self._complete = True  # the body ran to the connection's end, as announced
        else:
            self._error(ReplicaError(_lost_why(exc, self._head.done())))
        self._notify()

    def _error(self, exc: Exception) -> None:
        if self._exc is None:
            self._exc = exc
        if not self._head.done():
            self._head.set_exception(exc)
            self._head.exception()  # retrieved: a caller that gave up never warns
        self._notify()

    def _notify(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    # for the gateway
    def take(self) -> bytes | None:
        """Every byte of the body received and not taken yet, or None when there is none."""
        if not self._chunks:
            return None
        data = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        if self._paused:
            self._paused = False
            conn = self._conn
            if conn is not None and conn.transport is not None and not conn.closed:
                conn.transport.resume_reading()
        return data

    def ended(self) -> bool:
        """True when the body was taken to its end; ReplicaError when it broke."""
        if self._chunks:
            return False
        if self._exc is not None and not self._complete:
            raise self._exc
        return self._complete

    async def wait(self) -> None:
        """Until more of the body arrives, or it ends or breaks."""
        if self._chunks or self._complete or self._exc is not None:
            return
        self._wake = asyncio.get_running_loop().create_future()
        try:
            await self._wake
        finally:
            self._wake = None

    async def wait_complete(self) -> None:
        """Until the whole body arrived (or it broke): for short answers whose client
        cannot use a part of them (see gateway.httpserver)."""
        while not self._complete and self._exc is None:
            self._wake = asyncio.get_running_loop().create_future()
            try:
                await self._wake
            finally:
                self._wake = None

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive (chunked coding removed)."""
        try:
            while True:
                data = self.take()
                if data is not None:
                    yield data
                elif self.ended():
                    return
                else:
                    await self.wait()
        finally:
            await self.aclose()

    aiter_bytes = aiter_raw  # nothing is content-encoded: the gateway asks for identity

    async def aiter_lines(self) -> AsyncIterator[str]:
        pending = ""
        async for chunk in self.aiter_raw():
            pending += chunk.decode("utf-8", "replace")
            *lines, pending = pending.split("\n")
            for line in lines:
                yield line.removesuffix("\r")
        if pending:
            yield pending.removesuffix("\r")

    async def aread(self) -> bytes:
        return b"".join([c async for c in self.aiter_raw()])

    def abort(self) -> None:
        """Break the answer off (its client went away): the connection is closed, and a
        reader of the body gets a ReplicaError."""
        conn = self._conn
        if conn is not None:
            conn.abort()

    async def aclose(self) -> None:
        """Done with the answer: its connection back to the pool when it was read to the
        end and can be kept, else closed."""
        if self._released:
            return
        self._released = True
        conn, self._conn = self._conn, None
        if conn is None:
            return
        keep = self._complete and self._exc is None and self.keep_alive and conn.reusable()
        conn.finish()
        if keep and self._paused and conn.transport is not None:
            conn.transport.resume_reading()
        if keep:
            self._pool._put(conn)
        else:
            conn.abort()


def _lost_why(exc, after_head: bool) -> str:
    where = "in the middle of its answer" if after_head else "before answering"
    return f"the replica closed the connection {where}" + (f": {exc}" if exc else "")


class Pool:
    """Keep-alive connections to replicas, by (host, port)."""

    def __init__(self, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self.connect_timeout_s = connect_timeout_s
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self.opened = 0  # connections opened, for tests and benchmarks

    async def request(
        self,
        method: str,
        url: str,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        """Send one request; the answer once its status and headers arrived. The caller must
        read the body to its end or `aclose()` the answer. ReplicaError when it fails."""
        parts = urlsplit(url)
        host = parts.hostname or "127.0.0.1"
        port = parts.port or (443 if parts.scheme == "https" else 80)
        if parts.scheme != "http":
            raise ReplicaError(f"only http:// replicas are supported, not {url!r}")
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        head = _head(method, target, parts.netloc, len(body), headers or {})
        key = (host, port)
        for _ in range(2):
            conn = await self._get(key)
            answer = Answer(self)
            conn.start(answer)
            assert conn.transport is not None
            conn.transport.write(head + body if len(body) < 65536 else head)
            if len(body) >= 65536:
                conn.transport.write(body)
            try:
                await answer._head
            except ReplicaError:
                answer._released = True
                conn.finish()
                conn.abort()
                if conn.reused and not answer.got_bytes:
                    continue  # the replica closed an idle connection meanwhile: once more
                raise
            except BaseException:  # cancelled while waiting: the connection is unusable
                answer._released = True
                conn.finish()
                conn.abort()
                raise
            return answer
        raise ReplicaError("the replica closed the connection before answering")

    async def _get(self, key: tuple[str, int]) -> _Conn:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                conn.reused = True
                return conn
        loop = asyncio.get_running_loop()
        try:
            _transport, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Conn(key), key[0], key[1]),
                self.connect_timeout_s,
            )
        except (TimeoutError, OSError) as exc:
            raise ReplicaError(
                f"cannot connect to {key[0]}:{key[1]}: {exc or 'timed out'}"
            ) from None
        self.opened += 1
        return conn

    def _put(self, conn: _Conn) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) >= MAX_IDLE_PER_HOST:
            conn.abort()
            return
        idle.append(conn)

    def idle(self) -> int:
        return sum(len(v) for v in self._idle.values())

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.abort()
        self._idle.clear()


def _head(method: str, target: str, host: str, length: int, headers: Mapping[str, str]) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"host: {host}", f"content-length: {length}"]
    for k, v in headers.items():
        if "\r" in v or "\n" in v or "\r" in k or "\n" in k:
            raise ReplicaError(f"header {k!r} has a line break")
        if k.lower() not in ("host", "content-length", "transfer-encoding", "connection"):
            lines.append(f"{k}: {v}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


__all__ = ["Answer", "Headers", "Pool", "ReplicaError"]
