"""`aicluster status`: the control-plane replicas (each one's heartbeat row), which of them
leads, its lease epoch and the lease's age (GET /v1/control-plane, answered by any replica
from the shared state database). Ages are on the lease's clock (the database's on
PostgreSQL), so they do not depend on this machine's clock.

Vocabulary (store.lease): a replica is *leader* while it holds the lease unexpired, at
*epoch* N (every new holder increments it); the others are *followers*; a replica whose
heartbeat is older than three lease TTLs is *gone* (killed, or its machine lost).
"""

from __future__ import annotations

import typer

from aicluster.cli import output as out
from aicluster.cli.common import OutputFormat, OutputOpt, TokenOpt, UrlOpt, cli_errors, make_client


def _secs(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f} s"


def _role(r: dict) -> str:
    if r["leader"]:
        return "leader"
    return "follower" if r["alive"] else "gone"


def status(output: OutputOpt = OutputFormat.table, url: UrlOpt = None, token: TokenOpt = None):
    """The control-plane replicas, the leader, its lease epoch and age; the gateways that
    reported lately."""
    with cli_errors(), make_client(url, token) as c:
        view = c.request_json("GET", "/v1/control-plane")
    if output == OutputFormat.json:
        out.print_json(view)
        return
    lead = view.get("leader")
    if lead is None:
        line = "no leader has been elected yet"
    elif lead["expired"]:
        line = (
            f"no leader: the lease of {lead['holder']} (epoch {lead['epoch']}) expired "
            f"{_secs(-lead['expires_in_s'])} ago; a follower takes over at its next try"
        )
    else:
        line = (
            f"leader {lead['holder']}, epoch {lead['epoch']}: elected "
            f"{_secs(lead['acquired_s_ago'])} ago, lease renewed {_secs(lead['renewed_s_ago'])} "
            f"ago, expires in {_secs(lead['expires_in_s'])} (TTL {view['ttl_s']:g} s)"
        )
    out.console().print(line)
    out.print_table(
        view["replicas"],
        [
            ("REPLICA", lambda r: r["holder"] + (" *" if r["holder"] == view["this"] else "")),
            ("URL", "url"),
            ("ROLE", _role),
            ("EPOCH", lambda r: r["leading_epoch"] if r["leader"] else "-"),
            ("HEARTBEAT", lambda r: _secs(r["heartbeat_s_ago"]) + " ago"),
            ("UP", lambda r: out.fmt_duration(r["started_s_ago"])),
        ],
    )
    out.console().print("(* the replica that answered)")
    gateways = view.get("gateways", [])
    out.console().print(
        f"gateways reporting: {len(gateways)}"
        + "".join(f"\n  {g['id']} (last report {_secs(g['reported_s_ago'])} ago)" for g in gateways)
    )


def register(app: typer.Typer) -> None:
    app.command()(status)
