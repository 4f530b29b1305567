"""`aicluster usage` (what ended job attempts used and cost) and `aicluster prices set |
list` (admins set rates per pool and/or GPU model, from a time on)."""

from __future__ import annotations

import csv
import sys
from enum import Enum
from typing import Annotated

import typer

from aicluster.cli import output as out
from aicluster.cli.common import OutputFormat, OutputOpt, TokenOpt, UrlOpt, cli_errors, make_client


class UsageFormat(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"


BY = ("team", "user", "job", "pool", "gpu_model", "end_reason")
CSV_FIELDS = (
    "key",
    "lines",
    "gpu_hours",
    "gpu_seconds",
    "cpu_seconds",
    "memory_gib_seconds",
    "lost_gpu_seconds",
    "cost",
)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:,.2f}"


def usage(
    team: Annotated[str | None, typer.Option("--team", help="one team (members: theirs)")] = None,
    since: Annotated[
        str, typer.Option("--since", help="attempts that ended since: 7d, 12h, 30m, 2w or a date")
    ] = "30d",
    by: Annotated[str, typer.Option("--by", help="group by: " + ", ".join(BY))] = "team",
    output: Annotated[
        UsageFormat, typer.Option("--output", "-o", help="table, json or csv")
    ] = UsageFormat.table,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """GPU, CPU and memory hours and cost of ended job attempts, grouped (the usage ledger)."""
    params = {"since": since, "by": by}
    if team:
        params["team"] = team
    with cli_errors(), make_client(url, token) as c:
        report = c.request_json("GET", "/v1/usage", params=params)
    rows = [*report["groups"], {**report["total"], "key": "TOTAL"}]
    if output == UsageFormat.json:
        out.print_json(report)
    elif output == UsageFormat.csv:
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow([by if f == "key" else f for f in CSV_FIELDS])
        for r in rows:
            w.writerow([r[f] for f in CSV_FIELDS])
    else:
        out.print_table(
            rows,
            [
                (by.upper(), lambda r: r["key"] if r["key"] is not None else "-"),
                ("ATTEMPTS", "lines"),
                ("GPU-H", lambda r: _hours(r["gpu_seconds"])),
                ("LOST GPU-H", lambda r: _hours(r["lost_gpu_seconds"])),
                ("CPU-H", lambda r: _hours(r["cpu_seconds"])),
                ("MEM GIB-H", lambda r: _hours(r["memory_gib_seconds"])),
                ("COST", lambda r: f"{r['cost']:,.2f}"),
            ],
            title=f"usage since {out.fmt_time(report['since'])}",
        )


prices_app = typer.Typer(help="Prices per GPU-, CPU- and memory-GiB-hour (admins set them).")


@prices_app.command("set")
def set_price(
    pool: Annotated[str | None, typer.Option("--pool", help="the pool (default: every)")] = None,
    gpu_model: Annotated[
        str | None, typer.Option("--gpu-model", help="the GPU model (default: every)")
    ] = None,
    gpu_hour: Annotated[float | None, typer.Option("--gpu-hour", min=0.0)] = None,
    cpu_hour: Annotated[float | None, typer.Option("--cpu-hour", min=0.0)] = None,
    memory_gib_hour: Annotated[float | None, typer.Option("--memory-gib-hour", min=0.0)] = None,
    effective_from: Annotated[
        float | None,
        typer.Option("--from", help="UNIX seconds it takes effect (default: now)"),
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Set the rates of a pool and/or GPU model, in force from now (or --from) on."""
    body = {
        "pool": pool,
        "gpu_model": gpu_model,
        "gpu_hour": gpu_hour,
        "cpu_hour": cpu_hour,
        "memory_gib_hour": memory_gib_hour,
        "effective_from": effective_from,
    }
    with cli_errors(), make_client(url, token) as c:
        p = c.request_json("PUT", "/v1/prices", json=body)
    rates = ", ".join(
        f"{n.replace('_', '-')} {p[n]:g}"
        for n in ("gpu_hour", "cpu_hour", "memory_gib_hour")
        if p[n] is not None
    )
    out.console().print(
        f"pool {p['pool'] or '*'}, GPU model {p['gpu_model'] or '*'}: {rates} "
        f"from {out.fmt_time(p['effective_from'])}"
    )


@prices_app.command("list")
def list_prices(
    output: OutputOpt = OutputFormat.table, url: UrlOpt = None, token: TokenOpt = None
) -> None:
    """The prices set, newest last, and the catalog's default GPU-hour rates."""
    with cli_errors(), make_client(url, token) as c:
        data = c.request_json("GET", "/v1/prices")
    if output == OutputFormat.json:
        out.print_json(data)
        return
    out.print_table(
        data["prices"],
        [
            ("POOL", lambda r: r["pool"] or "*"),
            ("GPU MODEL", lambda r: r["gpu_model"] or "*"),
            ("GPU-HOUR", "gpu_hour"),
            ("CPU-HOUR", "cpu_hour"),
            ("MEM-GIB-HOUR", "memory_gib_hour"),
            ("FROM", lambda r: out.fmt_time(r["effective_from"])),
            ("BY", "actor"),
        ],
        title="prices set",
    )
    out.print_table(
        data["defaults"],
        [("GPU MODEL", "gpu_model"), ("NAME", "name"), ("GPU-HOUR", "gpu_hour")],
        title="catalog defaults (purchase price over the amortisation period; where none is set)",
    )


def register(app: typer.Typer) -> None:
    app.command()(usage)
    app.add_typer(prices_app, name="prices")
