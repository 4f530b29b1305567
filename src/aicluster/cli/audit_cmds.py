"""`aicluster audit`: the audit log (admins): who called which route, on what, with what
outcome, from where.

Invariants (cli.common): no traceback for a user mistake; `-o json` writes the entries
alone, oldest first, to stdout. Pages are fetched until the log is exhausted or `--limit`
entries have come.
"""

from __future__ import annotations

from typing import Annotated

import typer

from aicluster.cli import output as out
from aicluster.cli.common import OutputFormat, OutputOpt, TokenOpt, UrlOpt, cli_errors, make_client

PAGE = 1000


def audit(
    since: Annotated[
        str, typer.Option("--since", help="entries since: 1d, 12h, 30m, 2w or an ISO date")
    ] = "1d",
    user: Annotated[str | None, typer.Option("--user", help="one user's calls")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="at most this many")] = 10_000,
    output: OutputOpt = OutputFormat.table,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Show the audit log: every API call that changed something (admins only)."""
    entries: list[dict] = []
    with cli_errors(), make_client(url, token) as c:
        after = 0
        while len(entries) < limit:
            page = c.audit(since=since, user=user, after=after, limit=min(PAGE, limit))
            entries += page["entries"]
            if page["next"] is None:
                break
            after = page["next"]
    entries = entries[:limit]
    if output == OutputFormat.json:
        out.print_json(entries)
        return
    out.print_table(
        entries,
        [
            ("TIME", lambda e: out.fmt_time(e["ts"])),
            ("USER", lambda e: e["user"] or "(no valid token)"),
            ("ROLE", "role"),
            ("TEAM", "team"),
            ("CALL", lambda e: f"{e['method']} {e['route']}"),
            ("TARGET", "target"),
            ("STATUS", "status"),
            ("FROM", "source"),
        ],
        title=f"audit log since {since}" + (f", user {user}" if user else ""),
    )


def register(app: typer.Typer) -> None:
    app.command()(audit)
