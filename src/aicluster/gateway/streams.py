"""Streams between a replica and the gateway's client: an opened upstream answer, its
pass-through, and bounded reads.

Invariants:
- An `Opened` is closed exactly once (`close` is idempotent), however the stream that
  carries it ends: `ProxiedStream` runs its background task even when the body raises.
- Reads of bodies are bounded: `read_bounded` never reads past its limit, `read_upstream`
  stops at its limit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from aicluster.gateway.upstream import Answer


@dataclass
class Opened:
    """A replica's answer (status < 400), its body not read yet. `close` (idempotent) closes
    it and counts the request finished: whoever takes an Opened must call it."""

    upstream: Answer
    on_first: Callable[[], None]
    on_done: Callable[[], None]
    cold_start_ms: float | None = None
    _closed: bool = field(default=False, repr=False)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self.upstream.aclose()
        finally:
            self.on_done()


PASSED_HEADERS = ("content-type", "content-encoding", "cache-control", "x-request-id")


def answer_headers(opened: Opened) -> dict[str, str]:
    """The headers the client gets with a replica's answer: a few of the replica's, and
    how long a cold start held the request (when it was held)."""
    keep = {k: v for k, v in opened.upstream.headers.items() if k.lower() in PASSED_HEADERS}
    if opened.cold_start_ms is not None:
        keep["x-aicluster-cold-start-ms"] = f"{opened.cold_start_ms:.0f}"
    return keep


async def read_bounded(request: Request, limit: int) -> bytes | None:
    """The body, or None when it is longer than `limit` (read no further than that)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def read_upstream(upstream: Answer, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in upstream.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size >= limit:
            break
    return b"".join(chunks)[:limit]


class ProxiedStream(StreamingResponse):
    """Runs its background task (closing the upstream, counting the request finished)
    however the stream ends: Starlette skips it when the body raises, as it does when
    the replica breaks the stream after the first byte."""

    async def __call__(self, scope, receive, send) -> None:
        background, self.background = self.background, None
        try:
            await super().__call__(scope, receive, send)
        finally:
            if background is not None:
                await background()


def passthrough(
    opened: Opened, observe: Callable[[bytes], None] | None = None
) -> StreamingResponse:
    """The replica's answer as it comes: status, a few headers, the body's bytes (each
    also handed to `observe`, as it passes: gateway.usage reads the usage from them)."""
    upstream = opened.upstream

    async def body():
        first = True
        async for chunk in upstream.aiter_raw():
            if first and chunk:
                first = False
                opened.on_first()
            if observe is not None:
                observe(chunk)
            yield chunk

    return ProxiedStream(
        body(),
        status_code=upstream.status_code,
        headers=answer_headers(opened),
        background=BackgroundTask(opened.close),
    )
