"""Request body limits, enforced before anything parses or authenticates a request.

A pure ASGI middleware: a declared Content-Length above the route's limit is answered
413 at once, without reading the body; a streamed (chunked) body is counted as it
arrives and answered 413 as soon as it passes the limit, the rest never being read
(the connection is closed). Limits go by route family (`body_limit`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from aicluster.specs.limits import MAX_OPENAI_BODY_BYTES, MAX_WORKDIR_BYTES

MiB = 2**20
DEFAULT_LIMIT = 1 * MiB
# A job submission carries its working directory base64-encoded (4/3 of its size).
SUBMIT_LIMIT = -(-MAX_WORKDIR_BYTES // 3) * 4 + DEFAULT_LIMIT
SUBMIT_BATCH_LIMIT = SUBMIT_LIMIT + 7 * MiB  # up to 1,000 specs of a few KiB each
ARTIFACT_LIMIT = 64 * MiB  # upload manifests list every file
GATEWAY_LIMIT = MAX_OPENAI_BODY_BYTES  # the gateway enforces the same bound itself

# (method or None for any, path pattern, limit or None for unlimited); the first match wins.
FAMILIES: list[tuple[str | None, re.Pattern, int | None]] = [
    ("PUT", re.compile(r"^/v1/artifacts/uploads/[^/]+/blobs/[^/]+$"), None),  # streamed
    ("POST", re.compile(r"^/v1/jobs/?$"), SUBMIT_LIMIT),
    ("POST", re.compile(r"^/v1/jobs/batch/?$"), SUBMIT_BATCH_LIMIT),
    (None, re.compile(r"^/v1/artifacts(/|$)"), ARTIFACT_LIMIT),
    ("POST", re.compile(r"^/v1/(chat/completions|completions|embeddings)/?$"), GATEWAY_LIMIT),
    ("POST", re.compile(r"^/api/(chat|generate|embed|embeddings)/?$"), GATEWAY_LIMIT),  # Ollama
]


def body_limit(method: str, path: str) -> int | None:
    for want, pattern, limit in FAMILIES:
        if (want is None or want == method) and pattern.match(path):
            return limit
    return DEFAULT_LIMIT


def _declared_length(scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


async def _too_large(send, limit: int) -> None:
    body = json.dumps(
        {
            "detail": {
                "message": f"request body larger than {limit} bytes",
                "field": "(body)",
                "limit": limit,
            }
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimitMiddleware:
    def __init__(self, app, limit_for: Callable[[str, str], int | None] = body_limit):
        self.app = app
        self.limit_for = limit_for

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.limit_for(scope["method"], scope["path"])
        if limit is None:
            return await self.app(scope, receive, send)
        declared = _declared_length(scope)
        if declared is not None and declared > limit:
            return await _too_large(send, limit)
        state = {"received": 0, "started": False, "answered": False}

        async def counted_receive():
            if state["answered"]:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                state["received"] += len(message.get("body", b""))
                if state["received"] > limit:
                    if not state["started"]:
                        await _too_large(send, limit)
                    state["answered"] = True  # the app sees a disconnected client
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message):
            if state["answered"]:
                return  # 413 went out (or the app's answer was cut short): drop the rest
            if message["type"] == "http.response.start":
                state["started"] = True
            await send(message)

        await self.app(scope, counted_receive, guarded_send)
