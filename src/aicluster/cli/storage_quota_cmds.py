"""`aicluster artifacts quota [show|set|clear]`: a team's artifact storage quota.

Vocabulary: as in store.artifacts.quotas: the most bytes a team's artifact versions may
keep (distinct blobs, manifests included), shown next to what they keep now. Sizes are
bytes or sizes like 500Gi, 10G, 1.5T (specs.job.parse_memory, as the server's
--log-cap). Admins set and clear; members and viewers see their own team's.

Invariants (cli.common): no traceback for a user mistake (a bad SIZE is a usage error
naming it, exit 2); `-o json` writes the API's answer as it is.
"""

from __future__ import annotations

from typing import Annotated

import typer

from aicluster.cli import output as out
from aicluster.cli.common import OutputFormat, OutputOpt, TokenOpt, UrlOpt, cli_errors, make_client
from aicluster.client import artifacts as sdk

quota_app = typer.Typer(
    help="A team's artifact storage quota (admins set it; members see their team's).",
    no_args_is_help=True,
)

TeamArg = Annotated[str, typer.Argument(help="the team", show_default=False)]


def parse_size(text: str) -> int:
    """Bytes from `500Gi`, `10G`, `1048576`; typer.BadParameter naming SIZE otherwise."""
    from aicluster.specs.job import parse_memory

    try:
        return parse_memory(text.strip())
    except ValueError as exc:
        raise typer.BadParameter(
            str(exc).replace("memory size", "size").replace("memory", "SIZE"), param_hint="SIZE"
        ) from None


def quota_line(team: str, used: int, quota: int | None) -> str:
    """`team: 1.2 GiB of 500 GiB quota (0.2%)`, or `... (no quota)`."""
    if quota is None:
        return f"{team}: {out.fmt_bytes(used)} (no quota)"
    share = f"{100 * used / quota:.1f}%" if quota else ("over" if used else "0%")
    return f"{team}: {out.fmt_bytes(used)} of {out.fmt_bytes(quota)} quota ({share})"


def _print(q: dict, output: OutputFormat) -> None:
    if output == OutputFormat.json:
        out.print_json(q)
        return
    typer.echo(quota_line(q["team"], q["used_bytes"], q["quota_bytes"]))


@quota_app.command("show")
def show(
    team: Annotated[
        str | None, typer.Argument(help="the team (default: yours)", show_default=False)
    ] = None,
    output: OutputOpt = OutputFormat.table,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """A team's storage quota next to what its artifacts keep."""
    with cli_errors(), make_client(url, token) as c:
        if team is None:
            team = c.whoami().get("team")
            if team is None:
                raise typer.BadParameter("you belong to no team: name one", param_hint="TEAM")
        q = sdk.storage_quota(c, team)
    _print(q, output)


@quota_app.command("set")
def set_quota(
    team: TeamArg,
    size: Annotated[
        str, typer.Argument(metavar="SIZE", help="bytes, or 500Gi, 10G, 1.5T", show_default=False)
    ],
    output: OutputOpt = OutputFormat.table,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Set a team's storage quota (admins); uploads past it are refused."""
    nbytes = parse_size(size)
    with cli_errors(), make_client(url, token) as c:
        q = sdk.set_storage_quota(c, team, nbytes)
    _print(q, output)


@quota_app.command("clear")
def clear(
    team: TeamArg,
    output: OutputOpt = OutputFormat.table,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Remove a team's storage quota (admins)."""
    with cli_errors(), make_client(url, token) as c:
        q = sdk.set_storage_quota(c, team, None)
    _print(q, output)
