"""`aicluster tokens create | list | revoke`: API tokens and their lifecycle.

Invariants (cli.common): no traceback for a user mistake. `tokens create` prints the new
token once, on stdout alone (a note for the person goes to stderr); `tokens list` never
shows a secret, only each token's id, its first characters, its times and its state.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer
from rich.text import Text

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

STATE_STYLES = {"active": "green", "expired": "yellow", "revoked": "red"}


class Role(str, Enum):
    admin = "admin"
    member = "member"
    viewer = "viewer"


def token_create(
    user: Annotated[str, typer.Option("--user", help="user name", show_default=False)],
    team: Annotated[str | None, typer.Option("--team", help="team the user acts for")] = None,
    role: Annotated[Role, typer.Option("--role", help="admin, member or viewer")] = Role.member,
    expires: Annotated[
        str | None,
        typer.Option("--expires", help="it stops working this long from now: 30d, 12h, 2w"),
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Create an API token (admin). The token is printed once, on stdout alone."""
    with cli_errors(), make_client(url, token) as c:
        made = c.create_token(user, team=team, role=role.value, expires_in=expires)
    typer.echo(made["token"])
    who = f"user {made.get('user', user)}, team {made.get('team') or '-'}"
    until = made.get("expires_at")
    ends = f", expires {out.fmt_time(until)}" if until else ""
    note = f"token {made.get('id')} for {who}, role {made.get('role', role.value)}{ends}; "
    out.console(stderr=True).print(Text(note + "it is not shown again", style="dim"))


def token_list(
    user: Annotated[
        str | None, typer.Option("--user", help="whose tokens (default: yours; admins: anyone)")
    ] = None,
    all_users: Annotated[bool, typer.Option("--all", help="every user's (admins)")] = False,
    limit: LimitOpt = None,
    all_pages: AllPagesOpt = False,
    output: OutputOpt = OutputFormat.table,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """List API tokens without their secrets: id, first characters, times, state (every
    one, oldest first; one page of --limit without --all-pages)."""
    with cli_errors(), make_client(url, token) as c:
        tokens = c.tokens(user, all_users, limit, every=all_pages or limit is None)
    if output == OutputFormat.json:
        out.print_json(tokens)
        return
    out.print_table(
        tokens,
        [
            ("ID", "id"),
            ("USER", "user"),
            ("PREFIX", lambda t: t["prefix"] + "..."),
            ("CREATED", lambda t: out.fmt_time(t["created_at"])),
            ("EXPIRES", lambda t: out.fmt_time(t["expires_at"]) if t["expires_at"] else "never"),
            ("LAST USED", lambda t: out.fmt_time(t["last_used_at"])),
            ("STATE", lambda t: Text(t["state"], style=STATE_STYLES.get(t["state"], ""))),
        ],
    )


def token_revoke(
    token_id: Annotated[int, typer.Argument(help="the token's id (tokens list)", min=1)],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Revoke an API token for good (yours; admins: anyone's)."""
    with cli_errors(), make_client(url, token) as c:
        t = c.revoke_token(token_id)
    typer.echo(f"revoked token {t['id']} ({t['prefix']}...) of user {t['user']}")


def register(app: typer.Typer) -> None:
    tokens_app = typer.Typer(help="Create, list and revoke API tokens.", no_args_is_help=True)
    tokens_app.command("create")(token_create)
    tokens_app.command("list")(token_list)
    tokens_app.command("revoke")(token_revoke)
    app.add_typer(tokens_app, name="tokens")
