"""A replica answers only the platform: every request carries the replica's secret.

Vocabulary:
- replica secret: a per-replica random-looking string made by the control plane
  (`control.endpoints.ReplicaSecrets`), handed to the replica in its environment
  (`SECRET_ENV`, never on its command line, where any local user could read it)
  and sent by the gateway and the readiness probe in the `SECRET_HEADER` header.
- `RequireSecret`: ASGI middleware for the engines whose server is ours (builtin,
  simulated): every route, health included, answers 401 without the secret.
- auth proxy (`AuthProxy`): for engines that cannot check a header (vLLM, TGI, Ollama).
  The engine listens on a private port on 127.0.0.1; the proxy listens on the
  replica's public address, checks the first request of each connection and then
  pipes bytes both ways untouched (streams included). A TCP connection cannot be
  taken over by another process, so authenticating a connection once authenticates
  every keep-alive request on it.

Limit: the private port is still reachable from 127.0.0.1 by processes of the same
node; the sandbox (runtime.sandbox) is what keeps other teams' workloads from
being the platform's own user there.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import socket
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

SECRET_ENV = "AICLUSTER_REPLICA_SECRET"
SECRET_HEADER = "X-Aicluster-Replica-Secret"
_HEADER_KEY = SECRET_HEADER.lower().encode()
MAX_HEAD_BYTES = 64 * 1024
HEAD_TIMEOUT_S = 30.0

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable, Callable], Awaitable[None]]


def secret_matches(expected: str, given: bytes | str | None) -> bool:
    if given is None:
        return False
    if isinstance(given, str):
        given = given.encode("latin-1", "replace")
    return hmac.compare_digest(expected.encode(), given.strip())


def _refusal_body() -> bytes:
    err = {
        "message": "this replica answers only through the aicluster gateway",
        "type": "authentication_error",
        "param": None,
        "code": "replica_secret_required",
    }
    return json.dumps({"error": err}).encode()


class RequireSecret:
    """ASGI middleware: HTTP requests without the replica's secret get a 401."""

    def __init__(self, app: ASGIApp, secret: str) -> None:
        self.app, self.secret = app, secret

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http":
            given = next((v for k, v in scope.get("headers", ()) if k == _HEADER_KEY), None)
            if not secret_matches(self.secret, given):
                body = _refusal_body()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def protect(app: Any, secret: str | None) -> Any:
    """`app` behind `RequireSecret` when a secret is set (run by hand: open, for development)."""
    if secret:
        app.add_middleware(RequireSecret, secret=secret)
    return app


# -- the authenticating proxy, for engines that cannot check a header ---------------------


def _head_secret(head: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == _HEADER_KEY:
            return value
    return None


def _plain_response(status: int, reason: str, body: bytes) -> bytes:
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    except (ConnectionError, OSError):
        pass


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        await writer.wait_closed()
    except (ConnectionError, OSError):
        pass


class AuthProxy:
    """Listens on `sock`; forwards authenticated connections to upstream_host:upstream_port."""

    def __init__(
        self, sock: socket.socket, upstream_host: str, upstream_port: int, secret: str
    ) -> None:
        self.sock, self.secret = sock, secret
        self.upstream = (upstream_host, upstream_port)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        except (
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            TimeoutError,
            ConnectionError,
            OSError,
        ):
            await _close(writer)
            return
        if not secret_matches(self.secret, _head_secret(head)):
            writer.write(_plain_response(401, "Unauthorized", _refusal_body()))
            await _close(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            body = json.dumps(
                {
                    "error": {
                        "message": "the engine is not listening yet",
                        "type": "api_error",
                        "param": None,
                        "code": "engine_unreachable",
                    }
                }
            ).encode()
            writer.write(_plain_response(502, "Bad Gateway", body))
            await _close(writer)
            return
        up_writer.write(head)
        tasks = [
            asyncio.ensure_future(_pipe(reader, up_writer)),
            asyncio.ensure_future(_pipe(up_reader, writer)),
        ]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in tasks:
            t.cancel()
        await _close(up_writer)
        await _close(writer)

    async def serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        server = await asyncio.start_server(self._handle, sock=self.sock, limit=MAX_HEAD_BYTES)
        async with server:
            await self._stop.wait()

    def start(self) -> AuthProxy:
        """Serve on a daemon thread (the socket is already listening, so no wait)."""
        self._thread = threading.Thread(
            target=asyncio.run, args=(self.serve(),), name="replica-auth-proxy", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=5)


def listen(host: str, port: int) -> socket.socket:
    return socket.create_server((host, port), backlog=1024, reuse_port=False)
