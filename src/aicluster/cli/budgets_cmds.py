"""`aicluster budgets` (each team's monthly budget, what it spent this month and its
state), `aicluster budgets set TEAM` and `aicluster budgets delete TEAM` (admins).

`set` changes only the options given (a new budget needs `--monthly`); `--max-gpus none`
or `--max-queued-jobs none` removes that cap.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from aicluster.cli import output as out
from aicluster.cli.common import OutputFormat, OutputOpt, TokenOpt, UrlOpt, cli_errors, make_client

STATE_STYLES = {"ok": "green", "warned": "yellow", "over": "red"}
TeamArg = Annotated[str, typer.Argument(help="the team", show_default=False)]


def _cap(value: str | None, option: str) -> int | None:
    """A cap option's value: a whole number, or `none` (no cap)."""
    if value is None or value.strip().lower() == "none":
        return None
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise typer.BadParameter("a whole number, or none (no cap)", param_hint=option)
    return number


def _money(usd: float) -> str:
    """`$1,234.50`; under a dollar, with the digits that show it (`$0.40`, `$0.0021`)."""
    if usd == 0 or usd >= 1:
        return f"${usd:,.2f}"
    whole, _, cents = f"{usd:.6f}".rstrip("0").partition(".")
    return f"${whole}.{cents.ljust(2, '0')}"


def _or_none(value) -> str:
    return "-" if value is None else str(value)


def budgets(
    ctx: typer.Context,
    output: OutputOpt = OutputFormat.table,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Each team's monthly budget, spent this UTC month, state and caps (members: their
    team's); `budgets set TEAM` and `budgets delete TEAM` change them (admins)."""
    if ctx.invoked_subcommand is not None:
        return
    with cli_errors(), make_client(url, token) as c:
        rows = c.request_json("GET", "/v1/budgets")["budgets"]
    if output == OutputFormat.json:
        out.print_json(rows)
        return
    out.print_table(
        rows,
        [
            ("TEAM", "team"),
            ("MONTH", "month"),
            ("SPENT", lambda r: _money(r["spent_usd"])),
            ("BUDGET", lambda r: _money(r["monthly_usd"])),
            ("USED", lambda r: f"{r['used_ratio']:.0%}"),
            ("STATE", lambda r: Text(r["state"], style=STATE_STYLES.get(r["state"], ""))),
            ("WARN AT", lambda r: f"{r['warn_at']:.0%}"),
            ("ENFORCED", lambda r: "yes" if r["enforce"] else "no"),
            ("MAX GPUS", lambda r: _or_none(r["max_gpus"])),
            ("MAX QUEUED", lambda r: _or_none(r["max_queued_jobs"])),
        ],
    )


def set_budget(
    team: TeamArg,
    monthly: Annotated[
        float | None, typer.Option("--monthly", help="USD a month (a new budget needs it)")
    ] = None,
    warn_at: Annotated[
        float | None, typer.Option("--warn-at", help="the fraction that warns (default 0.8)")
    ] = None,
    enforce: Annotated[
        bool | None,
        typer.Option(
            "--enforce/--no-enforce",
            help="over budget, the team's new work waits (default: --no-enforce)",
            show_default=False,
        ),
    ] = None,
    max_gpus: Annotated[
        str | None,
        typer.Option("--max-gpus", help="GPUs held at once, all pools together; none: no cap"),
    ] = None,
    max_queued_jobs: Annotated[
        str | None,
        typer.Option("--max-queued-jobs", help="pending jobs at once; none: no cap"),
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Set a team's monthly budget and caps (admins); options left out keep their values."""
    body: dict = {}
    for name, value in (("monthly_usd", monthly), ("warn_at", warn_at), ("enforce", enforce)):
        if value is not None:
            body[name] = value
    if max_gpus is not None:
        body["max_gpus"] = _cap(max_gpus, "--max-gpus")
    if max_queued_jobs is not None:
        body["max_queued_jobs"] = _cap(max_queued_jobs, "--max-queued-jobs")
    with cli_errors(), make_client(url, token) as c:
        b = c.request_json("PUT", f"/v1/budgets/{team}", json=body)
    enforced = "enforced" if b["enforce"] else "not enforced"
    out.console().print(
        f"team {b['team']}: {_money(b['monthly_usd'])} a month, warn at {b['warn_at']:.0%}, "
        f"{enforced}, max_gpus {_or_none(b['max_gpus'])}, max_queued_jobs "
        f"{_or_none(b['max_queued_jobs'])}; {_money(b['spent_usd'])} spent in {b['month']} "
        f"({b['state']})"
    )


def delete_budget(team: TeamArg, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Remove a team's budget and caps (admins)."""
    with cli_errors(), make_client(url, token) as c:
        c.request_json("DELETE", f"/v1/budgets/{team}")
    out.console().print(f"team {team}: no budget, no caps")


def register(app: typer.Typer) -> None:
    budgets_app = typer.Typer(invoke_without_command=True)
    budgets_app.callback()(budgets)
    budgets_app.command("set")(set_budget)
    budgets_app.command("delete")(delete_budget)
    app.add_typer(budgets_app, name="budgets")
