"""CLI commands for jobs, nodes, events and teams: `register(app)` adds them.

Invariants: the options, the client config and the error handling of
`aicluster.cli.common` (no traceback for a user mistake; exit 2 for a bad spec,
1 otherwise, 130 for Ctrl-C). Machine-readable output (`-o json`)
goes to stdout alone; notes meant for a human reading a terminal go to stderr.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from aicluster.cli import output as out
from aicluster.cli import queue_cmds
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
from aicluster.client.api import TERMINAL, ApiError, Client

STATUSES = ("PENDING", "ADMITTED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED")


_JOB_HELP = "job id, or job name (the newest job of that name), or TEAM:NAME"
JobArg = Annotated[str, typer.Argument(help=_JOB_HELP, show_default=False)]


def _service_or_none(c: Client, name: str) -> dict | None:
    try:
        return c.service(name)
    except ApiError:
        return None


# --- jobs ------------------------------------------------------------------------


def submit(
    files: Annotated[
        list[Path],
        typer.Argument(
            help="job spec (YAML); several: one batch, all submitted or none",
            show_default=False,
        ),
    ],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="stream rank 0 logs")] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Submit job specs; with -f (one file), stream its logs and exit 1 unless it
    SUCCEEDED."""
    if follow and len(files) > 1:
        raise typer.BadParameter("--follow takes one spec file", param_hint="--follow")
    with cli_errors(), make_client(url, token) as c:
        if len(files) > 1:
            for job in c.submit_files(files):
                typer.echo(f"submitted {job['id']}")
            return
        job = c.submit_file(files[0])
        typer.echo(f"submitted {job['id']}")
        if not follow:
            return
        last = b"\n"
        for chunk in c.follow_logs(job["id"], rank=0):
            out.write_bytes(chunk)
            last = chunk
        job = c.job(job["id"])
        typer.echo(("" if last.endswith(b"\n") else "\n") + out.final_line(job))
        if job.get("status") != "SUCCEEDED":
            raise typer.Exit(1)


JOB_COLUMNS: list[out.Column] = [
    ("ID", "id"),
    ("NAME", "name"),
    ("TEAM", "team"),
    ("STATUS", lambda j: out.status_text(j.get("status"))),
    ("WORKERS", "workers"),
    ("AGE", lambda j: out.fmt_age(j.get("created_at"))),
    ("REASON/MESSAGE", out.reason_message),
]


def jobs(
    status: Annotated[
        list[str] | None,
        typer.Option("--status", "-s", help="only these statuses (repeat, or comma-separate)"),
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="every status (ignores --status)")] = False,
    team: Annotated[str | None, typer.Option("--team", help="only this team")] = None,
    limit: LimitOpt = None,
    all_pages: AllPagesOpt = False,
    output: OutputOpt = OutputFormat.table,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """List jobs newest first (every status and every team the token may see, unless
    filtered): one page (--limit), or every page with --all-pages."""
    wanted = [s.strip().upper() for v in status or [] for s in v.split(",") if s.strip()]
    bad = [s for s in wanted if s not in STATUSES]
    if bad:
        hint = f"unknown status {bad[0]}; use {', '.join(STATUSES)}"
        raise typer.BadParameter(hint, param_hint="--status")
    with cli_errors(), make_client(url, token) as c:
        wanted = None if all_ else wanted or None
        rows = c.jobs(status=wanted, team=team, limit=limit, every=all_pages)
    if output == OutputFormat.json:
        out.print_json(rows)
    else:
        out.print_table(rows, JOB_COLUMNS)


def describe(
    job_id: JobArg,
    output: OutputOpt = OutputFormat.table,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Show a job (spec, status, placement by rank, events) or a service (replicas)."""
    with cli_errors(job_id), make_client(url, token) as c:
        try:
            job = c.job(job_id)
        except ApiError as err:
            svc = _service_or_none(c, job_id) if err.status_code == 404 else None
            if svc is None:
                raise
            if output == OutputFormat.json:
                out.print_json(svc)
            else:
                from aicluster.cli.services_cmds import show_service

                show_service(svc)
            return
        if output == OutputFormat.json:
            out.print_json(job)
            return
        names: dict[str, str] = {}
        if job.get("placement") or job.get("attempts"):
            try:
                names = {n["node_id"]: n.get("name") or n["node_id"] for n in c.nodes()}
            except ApiError:
                pass
    spec = job.get("spec") or {}
    env = spec.get("env") or {}
    out.print_kv(
        [
            ("ID", job.get("id")),
            ("Name", job.get("name")),
            ("Team", job.get("team")),
            ("Owner", job.get("owner")),
            ("Status", out.status_text(job.get("status"))),
            ("Reason", job.get("reason")),
            ("Message", job.get("message")),
            ("Exit code", job.get("exit_code")),
            ("Priority", job.get("priority")),
            ("Workers", job.get("workers")),
            ("Resources", out.resources_text(spec.get("resources") or {}) + " (per worker)"),
            ("Command", out.command_text(spec.get("command"))),
            ("Env", ", ".join(sorted(env)) or "-"),
            ("Working dir", spec.get("working_dir")),
            ("Attempt", job.get("attempt")),
            ("Restarts", f"{job.get('restarts', 0)} of max {spec.get('max_restarts', 0)}"),
            ("Created", out.when(job.get("created_at"))),
            ("Started", out.when(job.get("started_at"))),
            ("Finished", out.when(job.get("finished_at"))),
            ("Runtime", out.runtime(job)),
        ]
    )
    placement = job.get("placement") or []
    if placement:
        rows = [{"rank": r, "node": names.get(n, n), "node_id": n} for r, n in enumerate(placement)]
        out.console().print()
        cols: list[out.Column] = [("RANK", "rank"), ("NODE", "node"), ("NODE ID", "node_id")]
        out.print_table(rows, cols, title="Placement")
    attempts = job.get("attempts") or []
    if attempts:
        out.console().print()
        out.print_table(attempts, _attempt_columns(names), title="Attempts")
    out.console().print()
    out.print_table(job.get("events") or [], EVENT_COLUMNS, title="Events")


def _attempt_columns(names: dict[str, str]) -> list[out.Column]:
    """One line per attempt: where it ran, when, how long, and why it ended."""

    def nodes(a: dict) -> str:
        return ", ".join(names.get(n, n[:12]) for n in a.get("placement") or []) or "-"

    return [
        ("ATTEMPT", "attempt"),
        ("NODES", nodes),
        ("STARTED", lambda a: out.fmt_time(a.get("started_at"))),
        ("ENDED", lambda a: out.fmt_time(a.get("ended_at"))),
        ("RUNTIME", lambda a: out.fmt_duration(a.get("runtime_s"))),
        ("END", lambda a: a.get("end_reason") or ("running" if not a.get("ended_at") else "-")),
        ("RECOVERED IN", _recovered_in),
    ]


def _recovered_in(a: dict) -> str:
    """How long the attempt took to run after the previous one was interrupted, and the
    phases (control.recovery): detection, queue, launch."""
    r = a.get("recovery")
    if not r:
        return "-"
    phases = f"detect {r['detection_s']:.1f}, queue {r['queue_s']:.1f}, launch {r['launch_s']:.1f}"
    return f"{r['total_s']:.1f} s ({phases})"


def logs(
    job_id: JobArg,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="until the job ends")] = False,
    rank: Annotated[int, typer.Option("--rank", help="worker rank", min=0)] = 0,
    attempt: Annotated[int | None, typer.Option("--attempt", help="(default: latest)")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Print a worker's log (raw bytes) of the latest or a given attempt."""
    with cli_errors(job_id), make_client(url, token) as c:
        if follow:
            for chunk in c.follow_logs(job_id, rank=rank, attempt=attempt):
                out.write_bytes(chunk)
            return
        offset = 0
        while True:
            data, offset, _, got = c.logs(job_id, rank=rank, attempt=attempt, offset=offset)
            if not data:
                return
            attempt = got  # later reads continue the same attempt
            out.write_bytes(data)


def cancel(job_id: JobArg, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Cancel a job (pending or running)."""
    with cli_errors(job_id), make_client(url, token) as c:
        job = c.cancel(job_id)
    status = job.get("status")
    if status == "CANCELLED":
        typer.echo(f"cancelled {job_id}")
    elif status in TERMINAL:
        typer.echo(f"job {job_id} already {status}")
    else:
        typer.echo(f"cancel requested for {job_id} (now {status})")


# --- nodes and events ----------------------------------------------------------------


def _node_name(node: dict) -> str:
    return (node.get("name") or node.get("node_id") or "-") + " (head)" * bool(node.get("is_head"))


NODE_COLUMNS: list[out.Column] = [
    ("NODE", _node_name),
    ("POOL", "pool"),
    (
        "STATE",
        lambda n: Text(
            str(n.get("state") or "-"), style="green" if n.get("state") == "Ready" else "yellow"
        ),
    ),
    ("REASON", lambda n: out.shorten(n.get("reason")) or "-"),
    ("CPUS", lambda n: out.used_total(n, "cpus")),
    ("MEMORY", lambda n: out.used_total(n, "memory", out.fmt_bytes)),
    ("GPUS", lambda n: out.used_total(n, "gpus")),
    ("GPU MODEL", "gpu_model"),
    ("LABELS", lambda n: ",".join(f"{k}={v}" for k, v in sorted((n.get("labels") or {}).items()))),
]


def nodes(
    limit: LimitOpt = None,
    output: OutputOpt = OutputFormat.table,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """List the cluster's nodes with used/total resources (every one, or --limit)."""
    with cli_errors(), make_client(url, token) as c:
        rows = c.nodes(limit=limit, every=limit is None)
    if output == OutputFormat.json:
        out.print_json(rows)
    else:
        rows = sorted(rows, key=lambda n: (not n.get("is_head"), str(n.get("name"))))
        out.print_table(rows, NODE_COLUMNS)


def _change(ev: dict) -> Text:
    if ev.get("from_status") or ev.get("to_status"):
        text = Text(f"{ev.get('from_status') or '-'} -> ")
        return text.append_text(out.status_text(ev.get("to_status")))
    return Text(str(ev.get("type") or "-"))


EVENT_COLUMNS: list[out.Column] = [
    ("ID", "id"),
    ("TIME", lambda e: out.fmt_time(e.get("ts"))),
    ("KIND", "kind"),
    ("OBJECT", "object_id"),
    ("CHANGE", _change),
    ("REASON", "reason"),
    ("MESSAGE", lambda e: out.shorten(e.get("message")) or "-"),
    ("ACTOR", "actor"),
]


def events(
    follow: Annotated[bool, typer.Option("--follow", "-f", help="print new events")] = False,
    object_id: Annotated[str | None, typer.Option("--object", help="only about this id")] = None,
    limit: LimitOpt = None,
    all_pages: AllPagesOpt = False,
    output: OutputOpt = OutputFormat.table,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Show the event log oldest first: one page (--limit), or every page with --all-pages
    or --follow (then poll for new events until Ctrl-C)."""
    with cli_errors(), make_client(url, token) as c:
        evs = c.events(after=0, object_id=object_id, limit=limit, every=all_pages or follow)
        if not follow:
            if output == OutputFormat.json:
                out.print_json(evs)
            else:
                out.print_table(evs, EVENT_COLUMNS)
            return
        last = 0
        while True:
            for ev in evs:
                last = max(last, int(ev.get("id") or 0))
                if output == OutputFormat.json:
                    typer.echo(json.dumps(ev, default=str))  # one event per line
                else:
                    _print_event_line(ev)
            time.sleep(1.0)
            evs = c.events(after=last, object_id=object_id, limit=limit, every=True)


def _print_event_line(ev: dict) -> None:
    line = Text(f"{out.fmt_time(ev.get('ts'))}  {ev.get('kind') or '-'} ")
    line.append(f"{ev.get('object_id') or '-'}  ")
    line.append_text(_change(ev))
    for extra in (ev.get("reason"), ev.get("message")):
        if extra:
            line.append(f"  {extra}")
    if ev.get("actor"):
        line.append(f"  ({ev['actor']})", style="dim")
    out.console().print(line)


# --- teams and tokens ----------------------------------------------------------------


def team_create(
    name: Annotated[str, typer.Argument(help="team name", show_default=False)],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Create a team (admin)."""
    with cli_errors(), make_client(url, token) as c:
        team = c.create_team(name)
    typer.echo(f"created team {team.get('name', name)}")


def team_list(
    output: OutputOpt = OutputFormat.table, url: UrlOpt = None, token: TokenOpt = None
) -> None:
    """List teams."""
    with cli_errors(), make_client(url, token) as c:
        names = c.teams()
    if output == OutputFormat.json:
        out.print_json(names)
    else:
        out.print_table([{"name": n} for n in names], [("TEAM", "name")])


def register(app: typer.Typer) -> None:
    """Add submit, jobs, describe, logs, cancel, nodes, events and the teams group
    (the tokens group: cli.tokens_cmds)."""
    app.command("submit")(submit)
    app.command("jobs")(jobs)
    app.command("describe")(describe)
    app.command("logs")(logs)
    app.command("cancel")(cancel)
    app.command("nodes")(nodes)
    app.command("events")(events)
    teams_app = typer.Typer(help="Create and list teams.", no_args_is_help=True)
    teams_app.command("create")(team_create)
    teams_app.command("list")(team_list)
    queue_cmds.register(app, teams_app)
    app.add_typer(teams_app, name="teams")
