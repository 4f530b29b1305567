"""`aicluster gateway`: the OpenAI and Ollama routes in processes of their own.

A gateway process follows the control plane's feed (gateway.follow) for the endpoint
table, people's tokens and rate limits, routes each request in memory (gateway.proxy)
and reports its demand and usage back. `aicluster up` starts one on the head; more can
run on any machine that reaches a control-plane replica and the replicas' nodes.

Each process serves with gateway.httpserver (the lean HTTP server: the OpenAI POST routes
straight from the socket, the rest through the FastAPI app); `--http uvicorn` serves the
same routes under uvicorn, to compare (bench/gateway_overhead.py).

`--workers N` starts N processes that share the port with SO_REUSEPORT (the kernel
spreads connections over them); the first process supervises the others and starts a
worker again if one dies. Each worker follows the feed and reports on its own, as any
other gateway does.

Invariants:
- No state store, no Ray: a gateway holds only what the feed gives it, and the admin
  token it was started with (read from a file or the environment, never from argv).
- Until the first feed answer arrives (at most `FIRST_SYNC_S` at start), requests are
  answered from an empty table; after that, from the last table received, whatever
  happens to the control plane.
- GET /healthz answers without a token: `synced` says whether the feed was received,
  `in_flight` how many requests this process has open (0 when idle: none leaked).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("aicluster.gateway")
FIRST_SYNC_S = 10.0
TOKEN_ENV = "AICLUSTER_GATEWAY_TOKEN"
# Connections the kernel queues before they are accepted. A burst of 1,000 clients overflows
# a backlog of 100 (asyncio's default): their ACKs are dropped and they see the connection
# reset on their first read.
BACKLOG = 2048


def gateway_id() -> str:
    host = re.sub(r"[^\w.-]", "-", socket.gethostname())[:40]
    return f"gw-{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def reuseport_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(BACKLOG)
    sock.set_inheritable(True)
    return sock


@dataclass
class Parts:
    """A gateway wired to the control plane: its routing core, its ASGI app (every route),
    the feed's follower and the reporter of demand and usage."""

    gateway: Any
    app: Any
    follower: Any
    reporter: Any

    def start(self) -> None:
        self.follower.start()
        self.reporter.start()

    async def stop(self) -> None:
        self.follower.stop()
        await self.gateway.close()
        self.reporter.stop()  # the last report and usage flush


def build(urls: list[str], token: str, hold_timeout_s: float = 120.0) -> Parts:
    from fastapi import FastAPI

    from aicluster.control.endpoints import EndpointTable
    from aicluster.gateway.follow import FeedFollower, Reporter, Upstreams
    from aicluster.gateway.proxy import Gateway
    from aicluster.gateway.ratelimit import Limiter
    from aicluster.gateway.tokens import TokenBook
    from aicluster.gateway.usage import UsageRecorder

    table, book, limiter = EndpointTable(), TokenBook(), Limiter()
    upstreams = Upstreams(urls, token)
    follower = FeedFollower(upstreams, table, book, limiter)
    gid = gateway_id()
    reporter = Reporter(upstreams, gid, table)
    reporter.usage = UsageRecorder(reporter.send_usage, source=gid)
    gw = Gateway(
        table, book.identify, hold_timeout_s=hold_timeout_s, usage=reporter.usage, limiter=limiter
    )
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(gw.router())

    @app.get("/healthz")
    def healthz():
        return {
            "ok": True,
            "gateway_id": gid,
            "synced": follower.synced.is_set(),
            "services": len(table.all()),
            "tokens": len(book),
            "in_flight": sum(table.demand(ep.team, ep.name).ongoing for ep in table.all()),
        }

    return Parts(gw, app, follower, reporter)


def first_sync(follower, deadline_s: float = FIRST_SYNC_S) -> bool:
    """Get the whole feed once before serving (True), or give up after `deadline_s`."""
    import httpx

    from aicluster.gateway.follow import UpstreamError

    end = time.monotonic() + deadline_s
    with httpx.Client(timeout=5.0) as client:
        while time.monotonic() < end:
            try:
                follower.poll(client, 0.0)
                return True
            except (UpstreamError, httpx.HTTPError, ValueError) as exc:
                log.warning("waiting for the control plane: %s", exc)
                time.sleep(0.5)
    return False


def serve(args, token: str) -> None:
    parts = build(args.control_plane, token, args.hold_timeout)
    sock = reuseport_socket(args.host, args.port)  # bound before the wait: the port is ours
    if not first_sync(parts.follower):
        log.warning("no control plane answered yet: serving an empty table until one does")
    log.info(
        "gateway pid %d serving http://%s:%d (%s)", os.getpid(), args.host, args.port, args.http
    )
    if args.http == "uvicorn":
        serve_uvicorn(parts, sock)
        return
    import uvloop

    uvloop.run(serve_lean(parts, sock))


async def serve_lean(parts: Parts, sock: socket.socket) -> None:
    """gateway.httpserver until SIGTERM or SIGINT, then drain and stop."""
    import asyncio

    from aicluster.gateway.httpserver import LeanServer

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = LeanServer(parts.gateway, parts.app)
    parts.start()
    try:
        await server.start(sock, BACKLOG)
        await server.serve_until(stop)
    finally:
        await parts.stop()


def serve_uvicorn(parts: Parts, sock: socket.socket) -> None:
    """The same routes under uvicorn, the hot ones in plain ASGI (gateway.fastpath): the
    stack the lean server replaced, kept to measure against (bench/gateway_overhead.py)."""
    import uvicorn

    from aicluster.gateway.fastpath import FastPath

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        parts.start()
        try:
            yield
        finally:
            await parts.stop()

    parts.app.router.lifespan_context = lifespan
    config = uvicorn.Config(
        FastPath(parts.gateway, parts.app),
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
        use_colors=False,
        timeout_keep_alive=30,
        backlog=BACKLOG,
    )
    uvicorn.Server(config).run(sockets=[sock])


def supervise(args, argv: list[str]) -> None:
    """Start `args.workers` worker processes and keep them running until SIGTERM."""
    stopping = False

    def stop(_sig, _frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    cmd = [sys.executable, "-m", "aicluster.gateway.process", *argv, "--workers", "1"]
    procs = [subprocess.Popen(cmd) for _ in range(args.workers)]
    while not stopping:
        time.sleep(0.2)
        for i, p in enumerate(procs):
            if p.poll() is not None and not stopping:
                log.warning("gateway worker %d exited (%s): starting it again", p.pid, p.returncode)
                procs[i] = subprocess.Popen(cmd)
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()


def read_token(path: Path | None) -> str:
    if path is not None:
        try:
            return path.read_text().strip()
        except OSError as exc:
            raise SystemExit(f"--token-file: cannot read {path}: {exc.strerror}") from None
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise SystemExit(f"--token-file or {TOKEN_ENV} is required: an admin's token")
    return token


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="aicluster-gateway")
    p.add_argument("--control-plane", action="append", required=True, metavar="URL")
    p.add_argument("--token-file", type=Path, default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8766)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--hold-timeout", type=float, default=120.0, metavar="SECONDS")
    p.add_argument(
        "--http",
        choices=("lean", "uvicorn"),
        default="lean",
        help="the HTTP server: gateway.httpserver (default) or uvicorn, to compare",
    )
    return p


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    if not 1 <= args.workers <= 64:
        raise SystemExit("--workers must be between 1 and 64")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per feed poll
    token = read_token(args.token_file)
    if args.workers > 1:
        os.environ[TOKEN_ENV] = token  # the workers read it from the environment
        rest = _without(argv, "--workers", "--token-file")
        supervise(args, rest)
        return
    serve(args, token)


def _without(argv: list[str], *options: str) -> list[str]:
    """argv without these options and their values (both `--opt V` and `--opt=V`)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in options:
            skip = True
            continue
        if any(a.startswith(o + "=") for o in options):
            continue
        out.append(a)
    return out


if __name__ == "__main__":
    main()
