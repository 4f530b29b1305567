"""What every command module shares: the `--url`, `--token` and `--output` options,
the client they make, and the one place user mistakes become messages.

Invariants (for every command that uses these):
- `--url` and `--token`, when omitted, come from `load_client_config`
  (environment, then files under AICLUSTER_HOME).
- A user mistake never shows a traceback: ApiError and SpecError are printed to
  stderr in red, one line per issue, and the exit code is 2 for a bad spec
  (a local SpecError or a 422 answer carrying spec issues) and 1 otherwise.
  A 404 for a named job prints "job X not found". Ctrl-C exits 130.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from typing import Annotated

import typer

from aicluster.cli import output as out
from aicluster.cli.config import load_client_config
from aicluster.client.api import ApiError, Client
from aicluster.specs import SpecError


class OutputFormat(str, Enum):
    table = "table"
    json = "json"


_URL_HELP = "API URL (default: AICLUSTER_URL, else the one `aicluster up` wrote)"
_TOKEN_HELP = "API token (default: AICLUSTER_TOKEN, else admin.token)"
UrlOpt = Annotated[str | None, typer.Option("--url", help=_URL_HELP)]
TokenOpt = Annotated[str | None, typer.Option("--token", help=_TOKEN_HELP)]
OutputOpt = Annotated[OutputFormat, typer.Option("--output", "-o", help="table or json")]
# List commands: one page of at most --limit rows (the server's default page without it),
# or with --all-pages every page, following the API's cursors (api.paging).
LimitOpt = Annotated[
    int | None, typer.Option("--limit", min=1, max=1000, help="at most this many (one page)")
]
AllPagesOpt = Annotated[
    bool, typer.Option("--all-pages", help="every page (--limit: the size of each page)")
]


def make_client(url: str | None, token: str | None) -> Client:
    """A Client for the given `--url`/`--token`, each falling back to the client config."""
    cfg = load_client_config(url, token)
    return Client(cfg.url, cfg.token)


@contextmanager
def cli_errors(job_id: str | None = None) -> Iterator[None]:
    """Turn ApiError/SpecError/Ctrl-C into a red message and an exit code."""
    try:
        yield
    except SpecError as err:
        out.print_error(str(err))
        raise typer.Exit(2) from None
    except ApiError as err:
        msg = err.message.lower()
        if job_id and err.status_code == 404 and "rank" not in msg and "attempt" not in msg:
            out.print_error(f"job {job_id} not found")
            raise typer.Exit(1) from None
        lines = [f"error: {err.message}"] + [out.issue_line(i) for i in err.issues]
        if err.status_code == 401:
            lines.append("  (pass --token or set AICLUSTER_TOKEN)")
        out.print_error("\n".join(lines))
        raise typer.Exit(2 if err.status_code == 422 and err.issues else 1) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
