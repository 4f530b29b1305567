"""`aicluster artifacts ...`: push, pull, ls, describe, tag, rm, share, gc, prune, usage,
scrub, quota (cli.storage_quota_cmds).

Invariants (as for every command, see cli.common): `--url`/`--token` or the
client config; a user mistake prints one red line naming the argument and exits
1, never a traceback; `-o json` prints JSON alone on stdout. Progress bars go to
stderr and only when it is a terminal (or `--progress` forces them).
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from aicluster.artifacts.manifest import ManifestError, list_folder
from aicluster.artifacts.names import KINDS
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
from aicluster.client import artifacts as sdk
from aicluster.client.api import ApiError

NameArg = Annotated[
    str,
    typer.Argument(help="team/name:version or :tag (team, version optional)", show_default=False),
]
ProgressOpt = Annotated[
    bool | None,
    typer.Option("--progress/--no-progress", help="progress bars (default: on a terminal)"),
]


@contextmanager
def _bars(enabled: bool | None):
    """A rich Progress on stderr, or None when disabled."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield None
        return
    cols = (
        TextColumn("{task.description:<10}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*cols, console=out.console(stderr=True), transient=False) as bars:
        yield bars


def _task(bars, description: str, total: int | None):
    if bars is None:
        return None
    task = bars.add_task(description, total=total)
    return lambda n: bars.advance(task, n)


def _parse_meta(items: list[str] | None) -> dict:
    meta = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ApiError(400, f"--meta {item!r}: expected KEY=VALUE")
        meta[key] = value
    return meta


def push(
    path: Annotated[Path, typer.Argument(help="file or folder to upload", show_default=False)],
    name: NameArg,
    kind: Annotated[str, typer.Option("--kind", "-k", help=" | ".join(KINDS))] = "model",
    meta: Annotated[list[str] | None, typer.Option("--meta", help="KEY=VALUE (repeat)")] = None,
    job: Annotated[str | None, typer.Option("--job", help="producer job id")] = None,
    output: OutputOpt = OutputFormat.table,
    progress: ProgressOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Upload PATH as a new version of NAME (only blobs the server lacks are sent)."""
    with cli_errors(), make_client(url, token) as c, _bars(progress) as bars:
        try:
            total = sum(p.stat().st_size for _, p in list_folder(path))
        except (ManifestError, OSError) as exc:
            raise ApiError(400, f"PATH: {exc}") from None
        hashing = _task(bars, "hashing", total)
        sent: list = [None]

        def plan(blobs: int, nbytes: int) -> None:
            sent[0] = _task(bars, f"upload {blobs}", nbytes)

        def advance(n: int) -> None:
            if sent[0]:
                sent[0](n)

        v = sdk.push(
            c,
            path,
            name,
            kind,
            metadata=_parse_meta(meta),
            producer_job=job,
            progress=advance,
            hashing=hashing,
            on_plan=plan,
        )
    if output == OutputFormat.json:
        out.print_json(v)
    else:
        typer.echo(f"pushed {v['ref']} ({v['file_count']} files, {out.fmt_bytes(v['size'])})")


def pull(
    name: NameArg,
    dest: Annotated[Path | None, typer.Argument(help="new folder (default ./NAME)")] = None,
    cache: Annotated[
        Path | None, typer.Option("--cache", help="node cache folder: DEST becomes read-only links")
    ] = None,
    cache_size: Annotated[
        str, typer.Option("--cache-size", help="cache limit, e.g. 50Gi")
    ] = "50Gi",
    output: OutputOpt = OutputFormat.table,
    progress: ProgressOpt = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Download a version (default: latest) into DEST, checking every file's sha256."""
    with cli_errors(), make_client(url, token) as c, _bars(progress) as bars:
        ref = sdk.resolve_ref(c, name)
        dest = dest or Path(ref.name)
        blob_cache = None
        if cache is not None:
            from aicluster.runtime.cache import BlobCache

            blob_cache = BlobCache(cache, _size(cache_size))
        got: list = [None]

        def plan(blobs: int, nbytes: int) -> None:
            got[0] = _task(bars, f"download {blobs}", nbytes)

        def advance(n: int) -> None:
            if got[0]:
                got[0](n)

        v, path = sdk.pull(c, name, dest, cache=blob_cache, progress=advance, on_plan=plan)
    if output == OutputFormat.json:
        out.print_json({**v, "path": str(path)})
    else:
        typer.echo(f"pulled {v['ref']} into {path}")


def _size(text: str) -> int:
    from aicluster.specs.job import parse_memory

    try:
        return parse_memory(text)
    except (ValueError, TypeError):
        raise ApiError(400, f"--cache-size {text!r}: expected bytes or 512Mi, 50Gi ...") from None


def ls(
    team: Annotated[str | None, typer.Option("--team", help="only this team")] = None,
    limit: LimitOpt = None,
    all_pages: AllPagesOpt = False,
    output: OutputOpt = OutputFormat.table,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """List the artifacts you can read (your team's and those shared with it): every one,
    or one page of --limit without --all-pages."""
    with cli_errors(), make_client(url, token) as c:
        arts = sdk.list_artifacts(c, team, limit, every=all_pages or limit is None)
    if output == OutputFormat.json:
        out.print_json(arts)
        return
    out.print_table(
        arts,
        [
            ("NAME", lambda a: f"{a['team']}/{a['name']}"),
            ("KIND", "kind"),
            ("LATEST", "latest"),
            ("VERSIONS", lambda a: len(a["versions"])),
            ("TAGS", lambda a: ", ".join(f"{t}:{v}" for t, v in sorted(a["tags"].items())) or "-"),
            ("SHARED WITH", lambda a: ", ".join(a["shared_with"]) or "-"),
            ("UPDATED", lambda a: out.fmt_age(a.get("updated_at"))),
        ],
    )


VERSION_COLUMNS: list[out.Column] = [
    ("VERSION", "version"),
    ("TAGS", lambda v: ", ".join(v["tags"]) or "-"),
    ("FILES", "file_count"),
    ("SIZE", lambda v: out.fmt_bytes(v["size"])),
    ("JOB", "producer_job"),
    ("BY", "created_by"),
    ("AGE", lambda v: out.fmt_age(v["created_at"])),
]


def describe(
    name: NameArg,
    output: OutputOpt = OutputFormat.table,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """An artifact and its versions, or with :VERSION one version and its files."""
    with cli_errors(), make_client(url, token) as c:
        d = sdk.describe(c, name)
    if output == OutputFormat.json:
        out.print_json(d)
    elif "files" in d:
        out.print_kv(
            [
                ("Artifact", d["ref"]),
                ("Kind", d["kind"]),
                ("Tags", ", ".join(d["tags"])),
                ("Size", out.fmt_bytes(d["size"])),
                ("Producer job", d["producer_job"]),
                ("Created by", d["created_by"]),
                ("Created", out.fmt_time(d["created_at"])),
                ("Manifest", d["manifest_sha256"]),
                ("Metadata", d["metadata"] or "-"),
            ]
        )
        out.print_table(
            d["files"],
            [("PATH", "path"), ("SIZE", lambda f: out.fmt_bytes(f["size"])), ("SHA256", "sha256")],
        )
    else:
        out.print_kv(
            [
                ("Artifact", f"{d['team']}/{d['name']}"),
                ("Kind", d["kind"]),
                ("Latest", d["latest"]),
                ("Shared with", ", ".join(d["shared_with"]) or "-"),
            ]
        )
        out.print_table(d["versions"], VERSION_COLUMNS)


def tag(
    name: NameArg,
    tag_name: Annotated[str, typer.Argument(metavar="TAG", help="tag to set", show_default=False)],
    remove: Annotated[bool, typer.Option("--remove", help="remove the tag instead")] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Point TAG at NAME's version (default latest), or --remove it."""
    with cli_errors(), make_client(url, token) as c:
        if remove:
            sdk.untag(c, name, tag_name)
            typer.echo(f"removed tag {tag_name}")
            return
        v = sdk.tag(c, name, tag_name)
    typer.echo(f"tagged {v['ref']} as {tag_name}")


def rm(name: NameArg, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Delete one version (NAME:VERSION or NAME:TAG); unreferenced blobs are collected."""
    with cli_errors(), make_client(url, token) as c:
        v = sdk.delete(c, name)
    typer.echo(f"deleted {v['ref']}")


def share(
    name: NameArg,
    team: Annotated[str, typer.Argument(help="team to share with", show_default=False)],
    remove: Annotated[bool, typer.Option("--remove", help="stop sharing")] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Let TEAM read NAME (every version), or --remove that."""
    with cli_errors(), make_client(url, token) as c:
        a = sdk.share(c, name, team, shared=not remove)
    typer.echo(f"{a['team']}/{a['name']} shared with: {', '.join(a['shared_with']) or 'nobody'}")


def gc(url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Delete blobs no version references (admin)."""
    with cli_errors(), make_client(url, token) as c:
        r = sdk.gc(c)
    typer.echo(f"deleted {r['deleted']} blob(s), freed {out.fmt_bytes(r['freed_bytes'])}")


def prune(
    name: NameArg,
    keep_last: Annotated[int, typer.Option("--keep-last", help="newest versions kept")],
    keep_every: Annotated[
        int, typer.Option("--keep-every", help="also every version numbered a multiple of K")
    ] = 0,
    output: OutputOpt = OutputFormat.table,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Delete the versions of NAME a retention policy does not keep (tagged ones stay)."""
    with cli_errors(), make_client(url, token) as c:
        r = sdk.prune(c, name, keep_last, keep_every)
    if output == OutputFormat.json:
        out.print_json(r)
        return
    gone = ", ".join(map(str, r["deleted"])) or "none"
    typer.echo(f"deleted versions: {gone}; freed {out.fmt_bytes(r['gc']['freed_bytes'])}")


def usage(
    team: Annotated[str | None, typer.Option("--team", help="one team (admins)")] = None,
    output: OutputOpt = OutputFormat.table,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Artifact storage used per team: distinct blobs of its versions, and its storage
    quota (admins: every team)."""
    with cli_errors(), make_client(url, token) as c:
        teams = sdk.usage(c, team)
    if output == OutputFormat.json:
        out.print_json(teams)
        return
    for name, u in teams.items():
        quota = u.get("quota_bytes")
        typer.echo(
            f"{name}: {out.fmt_bytes(u['bytes'])} in {u['blobs']} blob(s), "
            f"{u['versions']} version(s), "
            + ("no quota" if quota is None else f"quota {out.fmt_bytes(quota)}")
        )


def scrub(
    repair: Annotated[bool, typer.Option("--repair", help="delete the corrupt blobs")] = False,
    output: OutputOpt = OutputFormat.table,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Re-hash every stored blob and list the corrupt ones (admin); exit 1 if any."""
    with cli_errors(), make_client(url, token) as c:
        r = sdk.scrub(c, repair)
    if output == OutputFormat.json:
        out.print_json(r)
    else:
        typer.echo(f"checked {r['checked']} blob(s), {out.fmt_bytes(r['bytes'])}")
        for digest in r["corrupt"]:
            typer.echo(f"corrupt: {digest}" + (" (deleted)" if r["deleted"] else ""))
    if r["corrupt"]:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add the `artifacts` group."""
    sub = typer.Typer(help="Versioned datasets, checkpoints and models.", no_args_is_help=True)
    for fn in (push, pull, ls, describe, tag, rm, share, gc, prune, usage, scrub):
        sub.command(fn.__name__)(fn)
    from aicluster.cli.storage_quota_cmds import quota_app

    sub.add_typer(quota_app, name="quota")
    app.add_typer(sub, name="artifacts")
