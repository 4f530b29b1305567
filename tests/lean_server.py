"""The gateway's lean HTTP server (gateway.httpserver) on a loopback port, in a thread of
the test, and `serving_gateway`: a gateway behind either of its two fronts."""

from __future__ import annotations

import asyncio
import threading
from contextlib import contextmanager

from aicluster.gateway.fastpath import FastPath
from aicluster.gateway.httpserver import LeanServer
from aicluster.gateway.process import BACKLOG, reuseport_socket

from asgi_server import serving
from harness import free_port, wait_for

# the API server's in-process gateway; a gateway process; one under uvicorn (--http uvicorn)
FRONTS = ("fastapi", "lean", "fastpath")


@contextmanager
def serving_lean(gateway, app, port: int | None = None):
    """Yields the base URL while LeanServer(gateway, app) serves on 127.0.0.1."""
    port = port or free_port()
    sock = reuseport_socket("127.0.0.1", port)
    ready, state = threading.Event(), {}

    async def main() -> None:
        stop = asyncio.Event()
        server = LeanServer(gateway, app)
        await server.start(sock, BACKLOG)
        state["loop"], state["stop"] = asyncio.get_running_loop(), stop
        ready.set()
        try:
            await server.serve_until(stop)
        finally:
            await gateway.close()

    thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    thread.start()
    try:
        wait_for(lambda: ready.is_set() or not thread.is_alive(), timeout=30, what="lean start")
        assert ready.is_set(), "the lean server did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        if "loop" in state:
            state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(timeout=20)
        sock.close()


@contextmanager
def serving_gateway(gateway, app, front: str):
    """`app` (a FastAPI app with `gateway.router()`) behind `front`: uvicorn serving the app
    as the API server does, the lean server as a gateway process does, or uvicorn serving
    the hot routes in plain ASGI (gateway.fastpath) as `aicluster gateway --http uvicorn`."""
    if front == "lean":
        with serving_lean(gateway, app) as url:
            yield url
    elif front == "fastpath":
        with serving(FastPath(gateway, app)) as url:
            yield url
    else:
        with serving(app) as url:
            yield url
