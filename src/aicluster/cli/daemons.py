"""Processes `aicluster up` leaves running (the control plane, the gateway): started in a
session of their own with their output appended to a log under AICLUSTER_HOME, and
waited for until they answer. A process that exits or never answers is one red line with
the end of its log (exit 1), never a traceback."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import typer
from rich.console import Console

err = Console(stderr=True, soft_wrap=True)


def start_and_wait(
    cmd: list[str],
    env: dict,
    log_path: Path,
    ready: Callable[[], bool],
    what: str,
    timeout_s: float,
) -> subprocess.Popen:
    """Start `cmd` detached (stdout and stderr appended to `log_path`); the process once
    `ready()` is true."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace").splitlines()[-20:]
            err.print(f"[red]{what} exited:[/red]\n" + "\n".join(tail))
            raise typer.Exit(1)
        if ready():
            return proc
        time.sleep(0.3)
    err.print(f"[red]{what} did not answer within {timeout_s:g} s (see {log_path})[/red]")
    raise typer.Exit(1)
