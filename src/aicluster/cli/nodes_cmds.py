"""`aicluster cordon | drain | uncordon NODE` and `aicluster nodes rm NODE` (admins);
`aicluster nodes` lists them. A node is a machine: NODE is its name, its machine id or
its current Ray node id (each rejoin of the machine is a new Ray node id, an incarnation)."""

from __future__ import annotations

from typing import Annotated

import typer

from aicluster.cli import output as out
from aicluster.cli.common import (
    LimitOpt,
    OutputFormat,
    OutputOpt,
    TokenOpt,
    UrlOpt,
    cli_errors,
    make_client,
)
from aicluster.client.api import node_action

NodeArg = Annotated[
    str,
    typer.Argument(
        help="node name, machine id or Ray node id (a unique prefix of an id will do); "
        "the name and machine id stay the same when the machine rejoins"
    ),
]


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


def rm(node: NodeArg, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Retire a Down node now: it is no longer listed (nodes, metrics); its events stay.
    A live node is refused: drain it and stop it first. Nodes Down for longer than the
    control plane's --retire-down-after are retired on their own."""
    with cli_errors(), make_client(url, token) as c:
        rec = node_action(c, node, "retire")
    out.console().print(f"node {rec['node_id'][:12]} is retired")


def nodes(
    ctx: typer.Context,
    limit: LimitOpt = None,
    output: OutputOpt = OutputFormat.table,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """List the cluster's nodes with used/total resources; `nodes rm NODE` retires one."""
    if ctx.invoked_subcommand is None:
        from aicluster.cli.jobs_cmds import nodes as list_nodes

        list_nodes(limit=limit, output=output, url=url, token=token)


def register(app: typer.Typer) -> None:
    """cordon, drain, uncordon; `nodes` becomes a group (the listing, and `rm`)."""
    for cmd in (cordon, drain, uncordon):
        app.command()(cmd)
    # The plain listing stays where jobs_cmds registered it; the group runs it.
    app.registered_commands = [c for c in app.registered_commands if c.name != "nodes"]
    nodes_app = typer.Typer(invoke_without_command=True)
    nodes_app.callback()(nodes)
    nodes_app.command("rm")(rm)
    app.add_typer(nodes_app, name="nodes")
