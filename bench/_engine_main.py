"""One simulated engine for the benchmarks, with a bench-only reset route.

Run: `.venv/bin/python bench/_engine_main.py --port N [every simulated_engine flag]`.

It serves `aicluster.runtime.simulated_engine.create_app(options)` unchanged, wrapped so
that `POST /bench/reset` swaps in a fresh `create_app(options)`: an empty prefix cache,
empty batch, zeroed counters and a new clock origin, i.e. the state of a restarted
replica, without the cost of a restart between benchmark runs. Listens on 127.0.0.1.

Paced streams: a request whose body has `"user": "bench-pace-N"` gets each piece of its
answer N ms after the previous one (whatever the engine's own costs), so that a benchmark
can see whether a router holds chunks (bench/gateway_overhead.py's streaming phase). The
marker travels in the body because routers pass bodies on, not headers.
"""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from aicluster.runtime.simulated_engine import create_app, parse_args


class Resettable:
    """ASGI app: delegates to the current engine app; `/bench/reset` replaces it."""

    def __init__(self, options) -> None:
        self.options = options
        self.app = create_app(options)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] == "/bench/reset":
            self.app = create_app(self.options)
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/plain")],
                }
            )
            await send({"type": "http.response.body", "body": b"reset\n"})
            return
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            msg = await receive()
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        pace = PACE.search(body)
        if pace is None:
            await self.app(scope, replay, send)
            return
        gap_s = int(pace.group(1)) / 1e3

        async def paced_send(msg):
            if msg["type"] == "http.response.body" and msg.get("body"):
                await asyncio.sleep(gap_s)
            await send(msg)

        await self.app(scope, replay, paced_send)


PACE = re.compile(rb'"user"\s*:\s*"bench-pace-(\d+)"')


def main() -> None:
    import uvicorn

    _host, port, options = parse_args(sys.argv[1:])
    uvicorn.run(
        Resettable(options),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="off",
    )


if __name__ == "__main__":
    main()
