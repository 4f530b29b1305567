"""`aicluster usage` (what ended job attempts and replica runs used and cost, and what
teams store) and `aicluster prices set | list` (admins set rates per pool and/or GPU model,
from a time on; storage per GiB-month for every pool)."""

from __future__ import annotations

import csv
import sys
from enum import Enum
from typing import Annotated

import typer

from aicluster.cli import output as out
from aicluster.cli.common import OutputFormat, OutputOpt, TokenOpt, UrlOpt, cli_errors, make_client
from aicluster.cli.limits_cmds import set_token_price, token_usage


class UsageFormat(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"


BY = ("team", "user", "job", "service", "kind", "pool", "gpu_model", "end_reason")
CSV_FIELDS = (
    "key",
    "lines",
    "gpu_hours",
    "gpu_seconds",
    "cpu_seconds",
    "memory_gib_seconds",
    "lost_gpu_seconds",
    "cost",
    "storage_gib",
    "storage_gib_days",
    "storage_cost",
)
GiB = 2**30


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
    tokens: Annotated[
        bool,
        typer.Option("--tokens", help="tokens the gateways counted, by team|user|token|service"),
    ] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """GPU, CPU and memory hours and cost of ended job attempts and replica runs, grouped,
    and each team's storage (the usage ledger)."""
    if tokens:  # what the gateways counted (cli.limits_cmds)
        return token_usage(since, team, by, output == UsageFormat.json, url, token)
    params = {"since": since, "by": by}
    if team:
        params["team"] = team
    with cli_errors(), make_client(url, token) as c:
        report = c.request_json("GET", "/v1/usage", params=params)
    rows = [*report["groups"], {**report["total"], "key": "TOTAL"}]
    storage = report.get("storage") or {"groups": [], "total": None}
    if output == UsageFormat.json:
        out.print_json(report)
    elif output == UsageFormat.csv:
        kept = {g["key"]: g for g in storage["groups"]} if by == "team" else {}
        if storage["total"] is not None:
            kept["TOTAL"] = storage["total"]
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow([by if f == "key" else f for f in CSV_FIELDS])
        for r in rows:
            s = kept.get(r["key"])
            r = {**r, **_storage_fields(s)} if s else r
            w.writerow([r.get(f, "") for f in CSV_FIELDS])
    else:
        out.print_table(
            rows,
            [
                (by.upper(), lambda r: r["key"] if r["key"] is not None else "-"),
                ("LINES", "lines"),
                ("GPU-H", lambda r: _hours(r["gpu_seconds"])),
                ("LOST GPU-H", lambda r: _hours(r["lost_gpu_seconds"])),
                ("CPU-H", lambda r: _hours(r["cpu_seconds"])),
                ("MEM GIB-H", lambda r: _hours(r["memory_gib_seconds"])),
                ("COST", lambda r: f"{r['cost']:,.2f}"),
            ],
            title=f"usage since {out.fmt_time(report['since'])}",
        )
        if storage["groups"]:
            out.print_table(
                [*storage["groups"], {**storage["total"], "key": "TOTAL"}],
                [
                    ("TEAM", "key"),
                    ("GIB NOW", lambda r: f"{r['gib']:,.2f}"),
                    ("CHECKPOINTS GIB", lambda r: f"{r['checkpoints_bytes'] / GiB:,.2f}"),
                    ("LOGS GIB", lambda r: f"{r['logs_bytes'] / GiB:,.2f}"),
                    ("GIB-DAYS", lambda r: f"{r['gib_days']:,.2f}"),
                    ("COST", lambda r: f"{r['cost']:,.2f}"),
                ],
                title="storage (daily samples)",
            )


def _storage_fields(s: dict) -> dict:
    return {"storage_gib": s["gib"], "storage_gib_days": s["gib_days"], "storage_cost": s["cost"]}


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
    storage_gib_month: Annotated[
        float | None,
        typer.Option("--storage-gib-month", min=0.0, help="per GiB stored a month (every pool)"),
    ] = None,
    input_per_mtok: Annotated[
        float | None, typer.Option("--input-per-mtok", min=0.0, help="per million prompt tokens")
    ] = None,
    output_per_mtok: Annotated[
        float | None,
        typer.Option("--output-per-mtok", min=0.0, help="per million completion tokens"),
    ] = None,
    service: Annotated[
        str | None,
        typer.Option("--service", help="token rates of TEAM/NAME or NAME (default: every)"),
    ] = None,
    effective_from: Annotated[
        float | None,
        typer.Option("--from", help="UNIX seconds it takes effect (default: now)"),
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Set the rates of a pool and/or GPU model, in force from now (or --from) on."""
    if input_per_mtok is not None or output_per_mtok is not None or service is not None:
        set_token_price(service, input_per_mtok, output_per_mtok, effective_from, url, token)
        if all(v is None for v in (gpu_hour, cpu_hour, memory_gib_hour, storage_gib_month)):
            return
    body = {
        "pool": pool,
        "gpu_model": gpu_model,
        "gpu_hour": gpu_hour,
        "cpu_hour": cpu_hour,
        "memory_gib_hour": memory_gib_hour,
        "storage_gib_month": storage_gib_month,
        "effective_from": effective_from,
    }
    with cli_errors(), make_client(url, token) as c:
        p = c.request_json("PUT", "/v1/prices", json=body)
    rates = ", ".join(
        f"{n.replace('_', '-')} {p[n]:g}"
        for n in ("gpu_hour", "cpu_hour", "memory_gib_hour", "storage_gib_month")
        if p.get(n) is not None
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
            ("STORAGE-GIB-MONTH", "storage_gib_month"),
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
