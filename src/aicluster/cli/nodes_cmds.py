"""`aicluster cordon | drain | uncordon NODE` (admins)."""

from __future__ import annotations

from typing import Annotated

import typer

from aicluster.cli import output as out
from aicluster.cli.common import TokenOpt, UrlOpt, cli_errors, make_client
from aicluster.client.api import node_action

NodeArg = Annotated[str, typer.Argument(help="node id (a unique prefix will do) or name")]


def _act(node: str, action: str, url, token, grace_s: float | None = None) -> None:
    with cli_errors(), make_client(url, token) as c:
        rec = node_action(c, node, action, grace_s)
    out.console().print(
        f"node {rec['node_id'][:12]} is {rec['state']}"
        + (f" ({rec['reason']})" if rec.get("reason") else "")
    )


def cordon(node: NodeArg, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Take no new work on a node; what runs there keeps running."""
    _act(node, "cordon", url, token)


def drain(
    node: NodeArg,
    grace: Annotated[
        float, typer.Option("--grace", help="seconds running jobs may finish in")
    ] = 300.0,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """No new work; replicas move elsewhere first; jobs still there after --grace are
    stopped and requeued (resuming from their checkpoints)."""
    _act(node, "drain", url, token, grace)


def uncordon(node: NodeArg, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Let a cordoned or drained node take work again."""
    _act(node, "uncordon", url, token)


def register(app: typer.Typer) -> None:
    for cmd in (cordon, drain, uncordon):
        app.command()(cmd)
