"""`aicluster gateway`: a gateway process (gateway.process) in the foreground, and the one
`aicluster up` starts on the head.

Files under AICLUSTER_HOME: gateway.json (pid and URL of the gateway `up` started),
gateway.log (its log).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Annotated

import httpx
import psutil
import typer
from rich.console import Console

from aicluster.cli.config import home_dir
from aicluster.cli.daemons import start_and_wait

err = Console(stderr=True, soft_wrap=True)
GATEWAY_FILE = "gateway.json"
START_TIMEOUT_S = 60.0


def _synced(url: str) -> bool:
    try:
        return bool(httpx.get(url + "/healthz", timeout=2).json().get("synced"))
    except (httpx.HTTPError, ValueError):
        return False


def running_gateway(home: Path) -> str | None:
    """The URL of the gateway `up` started, when it runs and answers."""
    try:
        data = json.loads((home / GATEWAY_FILE).read_text())
    except (OSError, ValueError):
        return None
    pid, url = data.get("pid"), data.get("url", "")
    if pid and psutil.pid_exists(pid) and _synced(url):
        return url
    return None


def start_gateway(home: Path, cp_url: str, host: str, port: int, workers: int, env: dict) -> str:
    """Start `up`'s gateway (detached, logging to HOME/gateway.log); its URL once it has
    the control plane's feed. `env`: the control plane's (so `down` finds it too)."""
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    cmd = [sys.executable, "-m", "aicluster.gateway.process", "--control-plane", cp_url]
    cmd += ["--host", host, "--port", str(port), "--workers", str(workers)]
    cmd += ["--token-file", str(home / "admin.token")]
    proc = start_and_wait(
        cmd, env, home / "gateway.log", lambda: _synced(url), "the gateway", START_TIMEOUT_S
    )
    (home / GATEWAY_FILE).write_text(json.dumps({"pid": proc.pid, "url": url}))
    return url


def stop_gateway(home: Path) -> None:
    path = home / GATEWAY_FILE
    try:
        pid = json.loads(path.read_text()).get("pid")
    except (OSError, ValueError):
        pid = None
    if pid and psutil.pid_exists(pid):
        try:
            os.kill(pid, signal.SIGTERM)
            psutil.Process(pid).wait(timeout=30)
        except psutil.TimeoutExpired:
            os.kill(pid, signal.SIGKILL)
        except (psutil.NoSuchProcess, ProcessLookupError):
            pass
    path.unlink(missing_ok=True)


def gateway(
    control_plane: Annotated[
        list[str] | None,
        typer.Option(
            "--control-plane",
            help="a control-plane replica's URL; repeatable (the gateway fails over between "
            "them); default: this machine's (AICLUSTER_HOME/client.json)",
        ),
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(
            help="a file holding an admin's token (default: AICLUSTER_TOKEN, else "
            "AICLUSTER_HOME/admin.token)"
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="bind address")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port")] = 8766,
    workers: Annotated[
        int, typer.Option(help="processes sharing the port (SO_REUSEPORT)", min=1, max=64)
    ] = 1,
) -> None:
    """Serve the OpenAI and Ollama routes from this machine: a stateless gateway that
    follows the control plane (services, tokens, limits) and keeps serving while it is
    away."""
    from aicluster.gateway import process

    home = home_dir()
    urls = list(control_plane or [])
    if not urls:
        try:
            urls = [json.loads((home / "client.json").read_text())["url"]]
        except (OSError, ValueError, KeyError):
            err.print("[red]--control-plane URL is required (no local installation found)[/red]")
            raise typer.Exit(2) from None
    argv = [a for u in urls for a in ("--control-plane", u)]
    argv += ["--host", host, "--port", str(port), "--workers", str(workers)]
    if token_file is not None:
        argv += ["--token-file", str(token_file)]
    elif os.environ.get("AICLUSTER_TOKEN"):
        os.environ[process.TOKEN_ENV] = os.environ["AICLUSTER_TOKEN"]
    elif (home / "admin.token").exists():
        argv += ["--token-file", str(home / "admin.token")]
    process.main(argv)


def register(app: typer.Typer) -> None:
    app.command()(gateway)
