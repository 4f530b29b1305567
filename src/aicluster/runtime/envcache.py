"""The size limit of a folder of cached envs (runtime.envs): least recently used first out,
never one in use.

Vocabulary: an env is *used* when a workload starts with it (the runner touches
`USED_STAMP` inside it) and *in use* while any process started with it lives: the runner
takes a shared flock on `<key>.inuse` beside the env and hands the open descriptor down
through exec, so the lock lasts exactly as long as the workload (and whatever inherits
it). Eviction takes the same lock exclusively without waiting: held means in use, so the
env stays.

Invariants: only complete envs (with their marker) are counted or evicted; an evicted env
is first renamed out of its key (`.<key>.evicted-*`), so a runner never finds a half-
deleted one; the env just built or found by the caller is never evicted by its own call.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

USED_STAMP = ".aicluster-used"
MAX_BYTES_ENV = "AICLUSTER_ENVS_MAX_BYTES"
DEFAULT_MAX_BYTES = 50 * 2**30  # per folder (a user's, or the shared one)


@dataclass(frozen=True)
class CachedEnv:
    path: Path
    bytes: int
    used_at: float


def max_bytes(environ=os.environ) -> int:
    raw = environ.get(MAX_BYTES_ENV)
    try:
        return max(0, int(raw)) if raw else DEFAULT_MAX_BYTES
    except ValueError:
        return DEFAULT_MAX_BYTES


def folder_bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def mark_used(env: Path) -> None:
    """Stamp `env` as used now (best effort: a shared env may not be the caller's)."""
    try:
        Path(env, USED_STAMP).touch()
    except OSError:
        pass


def hold_in_use(env: Path) -> int | None:
    """A shared lock on `env`'s in-use file, inheritable across exec (the caller execs the
    workload with it open); None when it cannot be taken (a read-only shared folder)."""
    try:
        fd = os.open(env.parent / f"{env.name}.inuse", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return None
    fcntl.flock(fd, fcntl.LOCK_SH)
    os.set_inheritable(fd, True)
    return fd


def cached(folder: Path, marker: str) -> list[CachedEnv]:
    """The complete envs of `folder`, least recently used first."""
    out = []
    for env in Path(folder).iterdir() if Path(folder).is_dir() else ():
        meta = env / marker
        if env.name.startswith(".") or not meta.is_file():
            continue
        try:
            size = int(json.loads(meta.read_text()).get("bytes") or 0) or folder_bytes(env)
        except (OSError, ValueError):
            size = folder_bytes(env)
        stamp = env / USED_STAMP
        used = stamp.stat().st_mtime if stamp.exists() else meta.stat().st_mtime
        out.append(CachedEnv(env, size, used))
    return sorted(out, key=lambda e: e.used_at)


def evict(folder: Path, marker: str, limit: int, keep: Path | None = None, log=None) -> list[Path]:
    """Remove least recently used envs of `folder` not in use until it holds <= `limit`
    bytes; return the removed envs' paths."""
    envs = cached(folder, marker)
    total = sum(e.bytes for e in envs)
    removed = []
    for env in envs:
        if total <= limit:
            break
        if keep is not None and env.path == Path(keep):
            continue
        if _remove_unless_in_use(env.path):
            total -= env.bytes
            removed.append(env.path)
            if log is not None:
                log(
                    f"evicted env {env.path.name} ({env.bytes / 2**20:.0f} MiB, unused "
                    f"{(time.time() - env.used_at) / 3600:.1f} h): the cache is over {limit / 2**30:.1f} GiB"
                )
    return removed


def _remove_unless_in_use(env: Path) -> bool:
    lock = env.parent / f"{env.name}.inuse"
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a workload runs with it
        gone = env.parent / f".{env.name}.evicted-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(env, gone)
        except OSError:
            return False
        shutil.rmtree(gone, ignore_errors=True)
        return True
    finally:
        os.close(fd)
