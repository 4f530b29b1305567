"""`aicluster limits [set]` (rate limits per team and per token, admins set them), and the
token halves of `aicluster usage --tokens` (what the gateways counted) and `aicluster
prices set --input-per-mtok/--output-per-mtok` (per-million-token prices).

Invariants (cli.common): no traceback for a user mistake; `-o json` writes the API's
answer as it is.
"""

from __future__ import annotations

from typing import Annotated

import typer

from aicluster.cli import output as out
from aicluster.cli.common import OutputFormat, OutputOpt, TokenOpt, UrlOpt, cli_errors, make_client

limits_app = typer.Typer(
    help="Rate limits per team and per API token (requests/s with a burst, tokens/min).",
    invoke_without_command=True,
)

LIMIT_COLUMNS = [
    ("SCOPE", "scope"),
    ("TEAM/TOKEN", "subject"),
    ("REQUESTS/S", lambda r: "-" if r["requests_per_s"] is None else f"{r['requests_per_s']:g}"),
    ("BURST", lambda r: r["burst"] if r["burst"] is not None else "-"),
    ("TOKENS/MIN", lambda r: r["tokens_per_min"] if r["tokens_per_min"] is not None else "-"),
    ("SET", lambda r: out.fmt_time(r["updated_at"])),
    ("BY", "actor"),
]


@limits_app.callback()
def list_limits(
    ctx: typer.Context,
    output: OutputOpt = OutputFormat.table,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """The rate limits you may see (admins: all; members: their team's and own tokens')."""
    if ctx.invoked_subcommand is not None:
        return
    with cli_errors(), make_client(url, token) as c:
        data = c.request_json("GET", "/v1/limits")
    if output == OutputFormat.json:
        out.print_json(data)
        return
    out.print_table(data["limits"], LIMIT_COLUMNS, title="rate limits")


@limits_app.command("set")
def set_limit(
    team: Annotated[str | None, typer.Option("--team", help="a team's limits")] = None,
    token_id: Annotated[
        int | None, typer.Option("--token-id", "--id", help="a token's limits (its id)")
    ] = None,
    rps: Annotated[float | None, typer.Option("--rps", help="requests per second")] = None,
    burst: Annotated[int | None, typer.Option("--burst", help="requests at once")] = None,
    tpm: Annotated[int | None, typer.Option("--tpm", help="tokens per minute")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Set the limits of a team (--team) or a token (--token-id); none given: no limit."""
    if (team is None) == (token_id is None):
        raise typer.BadParameter("give --team or --token-id (one of them)")
    path = f"/v1/limits/teams/{team}" if team is not None else f"/v1/limits/tokens/{token_id}"
    body = {"requests_per_s": rps, "burst": burst, "tokens_per_min": tpm}
    with cli_errors(), make_client(url, token) as c:
        got = c.request_json("PUT", path, json=body)
    what = f"team {team}" if team is not None else f"token {token_id}"
    if got.get("removed"):
        out.console().print(f"{what}: no limit")
        return
    out.console().print(
        f"{what}: {got['requests_per_s'] if rps is not None else '-'} requests/s "
        f"(burst {got['burst'] if got['burst'] is not None else '-'}), "
        f"{got['tokens_per_min'] if tpm is not None else '-'} tokens/min"
    )


def token_usage(since: str, team: str | None, by: str, json_output: bool, url, token) -> None:
    """`aicluster usage --tokens`: requests, tokens and their cost, grouped."""
    params = {"since": since, "by": by}
    if team:
        params["team"] = team
    with cli_errors(), make_client(url, token) as c:
        report = c.request_json("GET", "/v1/usage/tokens", params=params)
    if json_output:
        out.print_json(report)
        return
    out.print_table(
        [*report["groups"], {**report["total"], "key": "TOTAL"}],
        [
            (by.upper(), lambda r: r["key"] if r["key"] not in (None, "") else "-"),
            ("REQUESTS", "requests"),
            ("ERRORS", "errors"),
            ("LIMITED", "limited"),
            ("PROMPT TOKENS", "prompt_tokens"),
            ("COMPLETION TOKENS", "completion_tokens"),
            ("COST", lambda r: f"{r['cost']:,.4f}"),
        ],
        title=f"token usage since {out.fmt_time(report['since'])}",
    )


def set_token_price(
    service: str | None,
    input_mtok: float | None,
    output_mtok: float | None,
    effective_from: float | None,
    url,
    token,
) -> None:
    """`aicluster prices set --input-per-mtok X --output-per-mtok Y [--service S]`."""
    body = {
        "service": service,
        "input_mtok": input_mtok,
        "output_mtok": output_mtok,
        "effective_from": effective_from,
    }
    with cli_errors(), make_client(url, token) as c:
        p = c.request_json("PUT", "/v1/prices/tokens", json=body)
    rates = ", ".join(
        f"{label} {p[n]:g}"
        for n, label in (("input_mtok", "input per Mtok"), ("output_mtok", "output per Mtok"))
        if p[n] is not None
    )
    out.console().print(
        f"service {p['service'] or '*'}: {rates} from {out.fmt_time(p['effective_from'])}"
    )


def register(app: typer.Typer) -> None:
    app.add_typer(limits_app, name="limits")
