"""The OpenAI POST routes in plain ASGI, in front of the gateway's FastAPI app.

Measured with `bench/gateway_overhead.py` (issue 19): FastAPI's routing, its `Request`
and Starlette's `StreamingResponse` (a task group per answer) were a large part of what a
gateway process added per request. `FastPath` answers `POST /v1/completions`,
`/v1/chat/completions` and `/v1/embeddings` itself, with the very same
`Gateway.forward` the FastAPI routes use (same authentication, limits, routing, errors,
usage), and hands every other request to the app unchanged.

Invariants:
- An answer is passed on chunk by chunk as the replica sends it: nothing is gathered.
- Whatever ends the exchange (the answer's end, the replica breaking it, the client going
  away), the `Opened` is closed exactly once, so the request is counted finished and its
  usage recorded.
- A client that goes away while an answer streams closes the replica's connection (the
  engine sees the disconnect, as it would without a gateway).
"""

from __future__ import annotations

import asyncio

from aicluster.gateway.proxy import ROUTES, Gateway
from aicluster.gateway.streams import answer_headers
from aicluster.gateway.upstream import ReplicaError

_PATHS = {f"/v1/{p}": p for p in ROUTES}


class FastPath:
    """ASGI app: the gateway's hot routes, then `app` for everything else."""

    def __init__(self, gateway: Gateway, app) -> None:
        self.gw, self.app = gateway, app

    async def __call__(self, scope, receive, send) -> None:
        path = _PATHS.get(scope.get("path", "")) if scope["type"] == "http" else None
        if path is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        out = await self.gw.forward(path, headers, lambda limit: _read_body(receive, limit))
        if not isinstance(out, tuple):
            await out(scope, receive, send)  # the gateway's error, a Starlette response
            return
        opened, observe = out
        upstream = opened.upstream
        watcher = asyncio.ensure_future(_until_disconnect(receive))
        watcher.add_done_callback(lambda _t: _on_disconnect(_t, opened))
        try:
            head = [
                (k.encode("latin-1"), v.encode("latin-1"))
                for k, v in answer_headers(opened).items()
            ]
            await send(
                {"type": "http.response.start", "status": upstream.status_code, "headers": head}
            )
            first = True
            try:
                async for chunk in upstream.aiter_raw():
                    if first and chunk:
                        first = False
                        opened.on_first()
                    observe(chunk)
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except ReplicaError:
                return  # the replica broke its answer: the client sees the stream end early
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()
            await opened.close()


async def _read_body(receive, limit: int) -> bytes | None:
    chunks, size = [], 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return None if size > limit else b"".join(chunks)
        body = msg.get("body", b"")
        size += len(body)
        if size > limit:
            return None
        chunks.append(body)
        if not msg.get("more_body", False):
            return b"".join(chunks) if len(chunks) != 1 else chunks[0]


async def _until_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _on_disconnect(task: asyncio.Future, opened) -> None:
    if task.cancelled() or task.exception() is not None:
        return
    opened.upstream.abort()  # the replica's connection: the engine stops generating


__all__ = ["FastPath"]
