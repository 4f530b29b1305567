"""One simulated engine for the benchmarks, with a bench-only reset route.

Run: `.venv/bin/python bench/_engine_main.py --port N [every simulated_engine flag]`.

It serves `aicluster.runtime.simulated_engine.create_app(options)` unchanged, wrapped so
that `POST /bench/reset` swaps in a fresh `create_app(options)`: an empty prefix cache,
empty batch, zeroed counters and a new clock origin, i.e. the state of a restarted
replica, without the cost of a restart between benchmark runs. Listens on 127.0.0.1.
"""

from __future__ import annotations

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
        await self.app(scope, receive, send)


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
