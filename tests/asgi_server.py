"""A real uvicorn server for an ASGI app, on a loopback port, in a thread of the test."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import uvicorn

from harness import free_port, wait_for


@contextmanager
def serving(app, port: int | None = None):
    """Yields the base URL while `app` serves on 127.0.0.1."""
    port = port or free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="on"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started or not thread.is_alive(), timeout=30, what="uvicorn start")
        assert server.started, "uvicorn did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
