"""The control-plane process's command line (api.server.main): every option, with the
environment variables that give their defaults. Durations and sizes are checked here, so
a bad value is one line naming the option (exit 2), never a traceback."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from aicluster.control.oplog import LOG_FORMATS


def _retention(text: str, what: str = "audit retention") -> float | None:
    """A retention: a duration (control.api_ops.parse_duration), or 0 for none."""
    from aicluster.control.api_ops import BadRequest, parse_duration

    if text.strip() == "0":
        return None
    try:
        return parse_duration(text, what)
    except BadRequest as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _log_cap(text: str) -> int | None:
    """A log cap: a size (specs.job.parse_memory: 100Mi, 1Gi), or 0 for none."""
    from aicluster.specs.job import parse_memory

    try:
        size = parse_memory(text.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("memory", "log cap")) from None
    return size or None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="aicluster-controlplane")
    p.add_argument("--home", required=True)
    p.add_argument("--ray-address", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--policy", default="fair", choices=["fair", "fifo", "backfill"])
    p.add_argument(
        "--shared-path",
        action="append",
        default=[],
        type=Path,
        help="a folder every workload may read and write (shared storage)",
    )
    p.add_argument(
        "--retire-down-after",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="retire a node Down for longer than this: no longer listed, its events kept "
        "(0: never on its own; `aicluster nodes rm` still does)",
    )
    p.add_argument(
        "--state",
        default=os.environ.pop("AICLUSTER_STATE", None),  # a URL may hold a password
        help="the state store: a SQLite file or postgresql://... (default HOME/state.db)",
    )
    p.add_argument(
        "--replica",
        action="store_true",
        help="a further replica (aicluster up --join-control-plane): its pid and URL go to "
        "HOME/controlplane-PORT.json, not HOME/controlplane.json",
    )
    p.add_argument(
        "--lease-ttl",
        type=float,
        default=3.0,
        metavar="SECONDS",
        help="the leader lease's time to live: a follower takes over this long after the "
        "leader stopped renewing",
    )
    p.add_argument(
        "--lease-renew",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="how often the leader renews the lease and a follower tries to take it",
    )
    p.add_argument(
        "--audit-retention",
        type=_retention,
        default=os.environ.get("AICLUSTER_AUDIT_RETENTION", "365d"),  # parsed by `type`
        metavar="DURATION",
        help="how long audit log entries are kept: 90d, 12w, ... (0: for ever); default "
        "AICLUSTER_AUDIT_RETENTION, else 365d",
    )
    p.add_argument(
        "--logs-retention",
        type=lambda text: _retention(text, "logs retention"),
        default=os.environ.get("AICLUSTER_LOGS_RETENTION", "90d"),  # parsed by `type`
        metavar="DURATION",
        help="how long the workers' logs of a job are kept after it ended: 30d, 12w, ... "
        "(0: for ever); default AICLUSTER_LOGS_RETENTION, else 90d",
    )
    p.add_argument(
        "--log-cap",
        type=_log_cap,
        default=os.environ.get("AICLUSTER_LOG_CAP", "100Mi"),  # parsed by `type`
        metavar="SIZE",
        help="the most bytes kept of one worker's log (per rank and attempt; the oldest "
        "are dropped): 100Mi, 1Gi, ... (0: no cap); default AICLUSTER_LOG_CAP, else 100Mi",
    )
    p.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="text: key=value lines; json: one JSON object per line",
    )
    return p
