"""`aicluster deploy | services | scale | delete` and `describe` of a service."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from aicluster.cli import output as out
from aicluster.cli.common import (
    AllPagesOpt,
    LimitOpt,
    OutputFormat,
    OutputOpt,
    TokenOpt,
    UrlOpt,
    cli_errors,
    make_client,
)

TeamOpt = Annotated[str | None, typer.Option("--team", help="team of the service (admins)")]


def deploy(
    file: Annotated[Path, typer.Argument(help="service spec (YAML)", show_default=False)],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Deploy a service; its replicas start as the scheduler places them."""
    with cli_errors(), make_client(url, token) as c:
        svc = c.deploy_file(file)
    out.console().print(
        f"deployed {svc['team']}/{svc['name']} ({svc['engine']}, "
        f"{svc['replicas_min']}..{svc['replicas_max']} replicas)"
    )


def services(
    limit: LimitOpt = None,
    all_pages: AllPagesOpt = False,
    output: OutputOpt = OutputFormat.table,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """List services with their ready replicas and load (every one; one page of --limit
    without --all-pages)."""
    with cli_errors(), make_client(url, token) as c:
        rows = c.services(limit, every=all_pages or limit is None)
    if output == OutputFormat.json:
        out.print_json(rows)
        return
    out.print_table(
        rows,
        [
            ("NAME", "name"),
            ("TEAM", "team"),
            ("ENGINE", "engine"),
            ("MODEL", "model"),
            ("READY", lambda s: f"{s['ready']}/{len(s['replicas'])}"),
            ("MIN..MAX", lambda s: f"{s['replicas_min']}..{s['replicas_max']}"),
            ("IN FLIGHT", "ongoing_requests"),
        ],
    )


def show_service(svc: dict) -> None:
    out.print_kv(
        [
            ("Service", f"{svc['team']}/{svc['name']}"),
            ("Engine", svc["engine"]),
            ("Model", svc["model"]),
            (
                "Replicas",
                f"{svc['ready']} ready, min {svc['replicas_min']}, max {svc['replicas_max']}",
            ),
            ("Manual count", svc["manual_replicas"]),
            ("In flight", svc["ongoing_requests"]),
            ("Routing", (svc["spec"].get("routing") or {}).get("policy")),
        ]
    )
    out.print_table(
        svc["replicas"],
        [
            ("REPLICA", "id"),
            ("STATUS", lambda r: out.status_text(r["status"])),
            ("NODE", lambda r: (r["node_id"] or "")[:8]),
            ("URL", "url"),
            ("ENGINE", lambda r: engine_text(r.get("engine_metrics") or {})),
            ("REASON", lambda r: out.reason_message(r)),
        ],
        title="Replicas",
    )


def engine_text(m: dict) -> str:
    """A replica's engine series as last scraped (vLLM): running/waiting, KV cache, prefix hits."""
    if not m:
        return ""
    text = f"{m.get('requests_running', 0):g} run/{m.get('requests_waiting', 0):g} wait"
    if "kv_cache_usage" in m:
        text += f" kv {100 * m['kv_cache_usage']:.1f}%"
    if m.get("prefix_cache_queries"):
        text += (
            f" prefix hits {100 * m.get('prefix_cache_hits', 0) / m['prefix_cache_queries']:.1f}%"
        )
    return text


def scale(
    name: Annotated[str, typer.Argument(help="service name")],
    replicas: Annotated[int, typer.Argument(help="replica count (0..max)")],
    team: TeamOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Pin a service's replica count (overrides autoscaling)."""
    with cli_errors(), make_client(url, token) as c:
        svc = c.scale(name, replicas, team)
    out.console().print(f"{svc['team']}/{svc['name']} scaled to {replicas}")


def delete(
    name: Annotated[str, typer.Argument(help="service name")],
    team: TeamOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Delete a service and stop its replicas."""
    with cli_errors(), make_client(url, token) as c:
        svc = c.delete_service(name, team)
    out.console().print(f"deleting {svc['team']}/{svc['name']}")


def register(app: typer.Typer) -> None:
    for cmd in (deploy, services, scale, delete):
        app.command()(cmd)
