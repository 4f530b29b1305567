"""Printing for the CLI: tables, JSON, human units, coloured statuses.

Invariants:
- Values from the server are never interpreted as rich markup: every cell is
  turned into a `rich.text.Text` before printing, so `[red]` in a job message
  prints literally.
- `print_json` writes plain `json.dumps(obj, indent=2)` to stdout, no styling, so
  `-o json` output is machine-readable.
- Consoles are created per call, so they follow sys.stdout/sys.stderr as they are
  at that moment (test runners swap them). When stdout is not a terminal the
  table width is COLUMNS or 200, so piped output keeps whole IDs.
- Formatters never raise on None or bad input; they return "-".
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

STATUS_STYLES = {
    "PENDING": "yellow",
    "ADMITTED": "cyan",
    "RUNNING": "blue",
    "SUCCEEDED": "green",
    "FAILED": "red",
    "CANCELLED": "magenta",
}

Column = tuple[str, "str | Callable[[dict], Any]"]


def console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    width = None
    if not (hasattr(stream, "isatty") and stream.isatty()):
        try:
            width = int(os.environ.get("COLUMNS", "")) or 200
        except ValueError:
            width = 200
    return Console(stderr=stderr, highlight=False, width=width, soft_wrap=False)


def _cell(value: Any) -> Text:
    if isinstance(value, Text):
        return value
    if value is None:
        return Text("-")
    return Text(str(value))


def print_table(
    rows: Sequence[dict],
    columns: Sequence[Column],
    title: str | None = None,
) -> None:
    """One row per dict; a column is (header, key) or (header, callable(row))."""
    table = Table(title=title, box=None, header_style="bold", pad_edge=False)
    for header, _ in columns:
        table.add_column(header, overflow="fold")
    for row in rows:
        table.add_row(*(_cell(get(row) if callable(get) else row.get(get)) for _, get in columns))
    console().print(table)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()


def print_kv(pairs: Sequence[tuple[str, Any]]) -> None:
    """Aligned `Key: value` lines (values may be Text for colour)."""
    width = max((len(k) for k, _ in pairs), default=0) + 1
    out = console()
    for key, value in pairs:
        line = Text(f"{key + ':':<{width}} ", style="bold")
        line.append_text(_cell(value))
        out.print(line)


def print_error(message: str) -> None:
    """Red text on stderr, one line per line of `message`."""
    out = console(stderr=True)
    for line in str(message).splitlines() or [""]:
        out.print(Text(line, style="red"))


def write_bytes(data: bytes) -> None:
    """Raw bytes to stdout (log output), flushed."""
    sys.stdout.flush()
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is not None:
        buffer.write(data)
        buffer.flush()
    else:
        sys.stdout.write(data.decode("utf-8", errors="replace"))
        sys.stdout.flush()


def status_text(status: str | None) -> Text:
    return Text(status or "-", style=STATUS_STYLES.get(status or "", ""))


def fmt_duration(seconds: float | None) -> str:
    """3s, 2m5s, 1h2m, 3d4h."""
    if seconds is None:
        return "-"
    try:
        s = max(0, int(seconds))
    except (TypeError, ValueError):
        return "-"
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60}m"
    return f"{s // 86400}d{s % 86400 // 3600}h"


def fmt_age(ts: float | None, now: float | None = None) -> str:
    """How long ago a UNIX time was, as fmt_duration."""
    if ts is None:
        return "-"
    try:
        return fmt_duration((time.time() if now is None else now) - float(ts))
    except (TypeError, ValueError):
        return "-"


def fmt_time(ts: float | None) -> str:
    """Local wall-clock time of a UNIX time."""
    if ts is None:
        return "-"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(ts)))
    except (TypeError, ValueError, OverflowError, OSError):
        return "-"


def fmt_bytes(n: float | None) -> str:
    """512 B, 1.5 GiB, 2 TiB (binary units, one decimal, no trailing .0)."""
    if n is None:
        return "-"
    try:
        value = float(n)
    except (TypeError, ValueError):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            break
        value /= 1024
    if unit == "B":
        return f"{int(value)} B"
    text = f"{value:.1f}".removesuffix(".0")
    return f"{text} {unit}"


def fmt_number(x: float | None) -> str:
    """2 for 2.0, 1.5 for 1.5."""
    if x is None:
        return "-"
    try:
        return f"{float(x):g}"
    except (TypeError, ValueError):
        return "-"


def shorten(text: str | None, width: int = 1000) -> str:
    """One line of at most `width` characters; a table folds it to the terminal's width,
    so a wide terminal (or a pipe) shows the whole reason."""
    text = " ".join((text or "").split())
    return text if len(text) <= width else text[: width - 1] + "…"


# --- job and node summaries ------------------------------------------------------


def issue_line(issue: object) -> str:
    if not isinstance(issue, dict):
        return f"  {issue}"
    where = f"line {issue['line']}: " if issue.get("line") else ""
    return f"  {where}{issue.get('field', '?')}: {issue.get('message', '')}"


def final_line(job: dict) -> str:
    """`job ID STATUS (reason; message; exit code N)`."""
    line = f"job {job['id']} {job.get('status')}"
    extra = [str(x) for x in (job.get("reason"), job.get("message")) if x]
    if job.get("exit_code") is not None:
        extra.append(f"exit code {job['exit_code']}")
    return line + (f" ({'; '.join(extra)})" if extra else "")


def reason_message(job: dict) -> str:
    parts = [p for p in (job.get("reason"), job.get("message")) if p]
    return shorten(": ".join(parts)) if parts else "-"


def command_text(command: object) -> str:
    return shlex.join(command) if isinstance(command, list) else str(command or "-")


def resources_text(res: dict) -> str:
    text = f"cpus={fmt_number(res.get('cpus', 1))} memory={fmt_bytes(res.get('memory', 0))}"
    text += f" gpus={res.get('gpus', 0)}"
    return text + (f" gpu_model={res['gpu_model']}" if res.get("gpu_model") else "")


def runtime(job: dict) -> str:
    if not job.get("started_at"):
        return "-"
    return fmt_duration((job.get("finished_at") or time.time()) - job["started_at"])


def when(ts: float | None) -> str:
    return "-" if not ts else f"{fmt_time(ts)} ({fmt_age(ts)} ago)"


def used_total(node: dict, key: str, fmt: Callable[[Any], str] = fmt_number) -> str:
    """`used/total` of a node resource, e.g. "2/8" or "4 GiB/64 GiB"."""
    used = (node.get("allocated") or {}).get(key, 0)
    return f"{fmt(used)}/{fmt(node.get(key, 0))}"
