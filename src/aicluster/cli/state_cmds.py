"""Where the control plane keeps its state, and `aicluster state migrate`.

The state location, decided in this order: `--state` > AICLUSTER_STATE > the `url` of
AICLUSTER_HOME/state.json (written by `aicluster up --state`) > AICLUSTER_HOME/state.db
(SQLite, the embedded default). A location is a SQLite file path, `sqlite:///PATH` or
`postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE`.

Invariants: a bad location is a red message naming `--state` (or where it came from) and
exit code 2, never a traceback; a password is never printed (URLs are shown masked);
state.json is 0600; `state migrate` never runs while this installation's control plane
does, and writes nothing to a target that is not empty.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from aicluster.cli import output as out
from aicluster.cli.config import home_dir

STATE_ENV = "AICLUSTER_STATE"
STATE_FILE = "state.json"

state_app = typer.Typer(
    name="state",
    help="The control plane's state store (SQLite or PostgreSQL).",
    no_args_is_help=True,
)


def _fail(message: str, code: int = 2) -> typer.Exit:
    out.print_error(message)
    return typer.Exit(code)


def _file_state(home: Path) -> str | None:
    try:
        data = json.loads((home / STATE_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise _fail(f"{home / STATE_FILE}: not a JSON object with a url ({exc})") from None
    url = data.get("url") if isinstance(data, dict) else None
    if not isinstance(url, str) or not url.strip():
        raise _fail(f'{home / STATE_FILE}: expected {{"url": "postgresql://..."}}')
    return url.strip()


def state_location(home: Path, given: str | None, option: str = "--state") -> tuple[str, str]:
    """(SQLAlchemy URL, what it came from) of the state location (module docstring).
    A bad one exits with code 2 and a message naming its source."""
    from aicluster.store.db import StateURLError, state_url

    if given is not None:
        raw, source = given, option
    elif os.environ.get(STATE_ENV):
        raw, source = os.environ[STATE_ENV], STATE_ENV
    else:
        raw, source = _file_state(home), str(home / STATE_FILE)
        if raw is None:
            raw, source = str(home / "state.db"), "the default"
    try:
        return state_url(raw), source
    except StateURLError as exc:
        raise _fail(f"{source}: {exc}") from None


def shown(url: str) -> str:
    """The URL with its password masked."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def remember_state(home: Path, url: str) -> None:
    """Record the location `up --state` was given, for later starts (0600: it may hold a
    password)."""
    path = home / STATE_FILE
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": url}, f)
    tmp.replace(path)


def check_reachable(url: str, option: str = "--state") -> None:
    """Connect once (PostgreSQL) so that a wrong host, password or database is a message
    now rather than a control plane that exits. SQLite files are made on first open."""
    if url.startswith("sqlite"):
        return
    from aicluster.store.db import StateStoreError, ping

    try:
        ping(url)
    except StateStoreError as exc:
        raise _fail(f"{option}: {exc}") from None


def control_plane_running(home: Path) -> int | None:
    """The pid of this installation's control plane when one runs, else None."""
    import psutil

    try:
        pid = json.loads((home / "controlplane.json").read_text()).get("pid")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(pid, int) or not psutil.pid_exists(pid):
        return None
    try:
        return pid if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE else None
    except psutil.NoSuchProcess:
        return None


@state_app.command("migrate")
def migrate_cmd(
    to: Annotated[
        str, typer.Option("--to", help="the empty PostgreSQL database: postgresql://...")
    ],
    from_: Annotated[
        str | None,
        typer.Option("--from", help="the SQLite state to copy (default: AICLUSTER_HOME/state.db)"),
    ] = None,
) -> None:
    """Copy this installation's SQLite state to an empty PostgreSQL database, verified by
    row counts and checksums, while the platform is stopped."""
    from aicluster.store.db import make_engine
    from aicluster.store.transfer import TransferError, copy_state

    home = home_dir()
    source, source_from = state_location(home, from_ or str(home / "state.db"), "--from")
    target, _ = state_location(home, to, "--to")
    if not source.startswith("sqlite"):
        raise _fail(f"{source_from}: the state to copy must be SQLite, not {shown(source)}")
    if not target.startswith("postgresql"):
        raise _fail(f"--to: the target must be postgresql://..., not {shown(target)}")
    if not Path(source.split("///", 1)[1]).is_file():
        raise _fail(f"{source_from}: no SQLite state at {shown(source)}")
    pid = control_plane_running(home)
    if pid is not None:
        raise _fail(
            f"the control plane is running (pid {pid}, AICLUSTER_HOME={home}): stop it with "
            "`aicluster down` first, so that nothing changes while the state is copied",
            1,
        )
    check_reachable(target, "--to")
    src, dst = make_engine(source), make_engine(target)
    try:
        checks = copy_state(src, dst)
    except TransferError as exc:
        raise _fail(f"--to {shown(target)}: {exc}", 1) from None
    finally:
        src.dispose()
        dst.dispose()
    _print_checks(checks)
    bad = [c.table for c in checks if not c.ok]
    if bad:
        raise _fail(f"verification failed for: {', '.join(bad)}", 1)
    out.console().print(
        f"copied {sum(c.source_rows for c in checks)} rows of {len(checks)} tables to "
        f"{shown(target)}; start on it with: aicluster up --state '{shown(target)}'"
    )


def _print_checks(checks) -> None:
    rows = [
        {
            "table": c.table,
            "source": c.source_rows,
            "target": c.target_rows,
            "checksum": c.source_sum[:16],
            "ok": "ok" if c.ok else "MISMATCH",
        }
        for c in checks
    ]
    out.print_table(
        rows,
        [
            ("TABLE", "table"),
            ("SQLITE ROWS", "source"),
            ("POSTGRESQL ROWS", "target"),
            ("CHECKSUM", "checksum"),
            ("", "ok"),
        ],
    )


def register(app: typer.Typer) -> None:
    app.add_typer(state_app)
