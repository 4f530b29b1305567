"""`aicluster queue` and `aicluster teams set-quota | quotas`."""

from __future__ import annotations

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


def queue(
    limit: LimitOpt = None,
    all_pages: AllPagesOpt = False,
    output: OutputOpt = OutputFormat.table,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Pending workloads in the order the scheduler considers them, and why each waits:
    one page (--limit), or every page with --all-pages."""
    with cli_errors(), make_client(url, token) as c:
        rows = c.queue(limit=limit, every=all_pages)
    if output == OutputFormat.json:
        out.print_json(rows)
        return
    out.print_table(
        rows,
        [
            ("#", "position"),
            ("WORKLOAD", "workload"),
            ("TEAM", "team"),
            ("WORKERS", "workers"),
            ("PRIORITY", "priority"),
            ("AGE", lambda r: out.fmt_age(r["submitted_at"])),
            ("WAITING BECAUSE", lambda r: out.shorten(r["reason"])),
        ],
    )


def set_quota(
    team: Annotated[str, typer.Argument(help="team")],
    pool: Annotated[str, typer.Option("--pool", help="pool the quota is for")] = "default",
    gpus: Annotated[int, typer.Option("--gpus", min=0, help="guaranteed GPUs")] = 0,
    borrow: Annotated[
        int | None,
        typer.Option(
            "--borrow", min=0, help="most GPUs it may borrow beyond --gpus (default: no limit)"
        ),
    ] = None,
    lend: Annotated[
        int | None,
        typer.Option(
            "--lend", min=0, help="most unused guaranteed GPUs others may borrow (default: all)"
        ),
    ] = None,
    weight: Annotated[float, typer.Option("--weight", min=0.0, help="fair-share weight")] = 1.0,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Set a team's quota in a pool (admins)."""
    body = {"gpus": gpus, "borrow_gpus": borrow, "lend_gpus": lend, "weight": weight}
    with cli_errors(), make_client(url, token) as c:
        q = c.set_quota(team, pool, body)
    out.console().print(
        f"{q['team']} in pool {q['pool']}: {q['gpus']} GPUs guaranteed, borrow "
        f"{'any' if q['borrow_gpus'] is None else q['borrow_gpus']}, lend "
        f"{'all' if q['lend_gpus'] is None else q['lend_gpus']}"
    )


def quotas(
    output: OutputOpt = OutputFormat.table, url: UrlOpt = None, token: TokenOpt = None
) -> None:
    """List team quotas."""
    with cli_errors(), make_client(url, token) as c:
        rows = c.quotas()
    if output == OutputFormat.json:
        out.print_json(rows)
        return
    out.print_table(
        rows,
        [
            ("TEAM", "team"),
            ("POOL", "pool"),
            ("GPUS", "gpus"),
            ("BORROW", "borrow_gpus"),
            ("LEND", "lend_gpus"),
            ("WEIGHT", "weight"),
        ],
    )


def register(app: typer.Typer, teams_app: typer.Typer | None = None) -> None:
    app.command()(queue)
    app.command()(quotas)
    if teams_app is not None:
        teams_app.command("set-quota")(set_quota)
