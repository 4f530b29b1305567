"""Worker logs kept by the control plane: per job (or replica gang), attempt and rank.

`LogStore` keeps them in files under one folder (one control plane, and the unit tests);
`SharedLogStore` in the state store (store.jobfiles), where every control-plane replica,
on any machine, reads what the leader pulled: the API server uses it. Both have the same
methods.

Invariant: a log only grows, and its size is the offset of the next byte to pull from the
worker, so pulling is idempotent across control-plane restarts and leader changes; bytes
pulled at an offset are stored once, however many replicas pull them (`append(at=)`).

Bounds (SharedLogStore): the *log cap* keeps a rank's newest bytes only, and a read from a
dropped offset gets one marker line, "... N bytes dropped ...", then the bytes kept; the
*logs retention* deletes the logs of jobs that ended longer ago (the leader, in small
transactions), after which the job has a LogsRemoved event and reading its logs raises
LogsRemoved instead of answering nothing.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

COLLECT_EVERY_S = 60.0  # how often the leader looks for ended jobs' logs to delete
COLLECT_BATCH = 500  # chunks deleted per transaction


class LogStore:
    def __init__(self, root: Path):
        self.root = root

    def path(self, job_id: str, attempt: int, rank: int) -> Path:
        return self.root / job_id / f"a{attempt}" / f"rank-{rank}.log"

    def offset(self, job_id: str, attempt: int, rank: int) -> int:
        p = self.path(job_id, attempt, rank)
        return p.stat().st_size if p.exists() else 0

    def append(
        self, job_id: str, attempt: int, rank: int, data: bytes, at: int | None = None
    ) -> None:
        """Add what `data` (pulled at offset `at`; None: the end) has past the log's end."""
        end = self.offset(job_id, attempt, rank)
        at = end if at is None else at
        data = data[end - at :] if at <= end else b""
        if not data:
            return
        p = self.path(job_id, attempt, rank)
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "ab") as f:
            f.write(data)

    def attempts(self, job_id: str) -> list[int]:
        d = self.root / job_id
        if not d.exists():
            return []
        return sorted(int(m[1]) for p in d.iterdir() if (m := re.fullmatch(r"a(\d+)", p.name)))

    def read(
        self, job_id: str, attempt: int, rank: int, offset: int = 0, limit: int = 1 << 20
    ) -> bytes:
        p = self.path(job_id, attempt, rank)
        if not p.exists():
            return b""
        with open(p, "rb") as f:
            f.seek(offset)
            return f.read(limit)

    def read_from(
        self, job_id: str, attempt: int, rank: int, offset: int = 0, limit: int = 1 << 20
    ) -> tuple[bytes, int]:
        data = self.read(job_id, attempt, rank, offset, limit)
        return data, offset + len(data)

    def removed(self, job_id: str) -> str | None:
        return None  # files are never collected

    def collect(self) -> int:
        return 0


class LogsRemoved(Exception):
    """The logs asked for were deleted by the logs retention (the API answers 410)."""


def dropped_marker(n: int) -> bytes:
    """What a read shows in place of the `n` oldest bytes the log cap dropped."""
    return f"... {n} bytes dropped ...\n".encode()


class SharedLogStore:
    """Logs in the state store. `legacy_root`: the folder of an installation's logs from
    before they moved there, still read (never written) for the attempts it holds.

    `cap_bytes`: a rank's log keeps about its newest `cap_bytes` (whole chunks of one pull,
    at most 1 MiB, are dropped); None keeps everything. `retention_s`: the logs of a job
    are deleted this long after it ended (by the leader's `collect`); None keeps them."""

    def __init__(
        self,
        files,
        legacy_root: Path | None = None,
        cap_bytes: int | None = None,
        retention_s: float | None = None,
        collect_every_s: float = COLLECT_EVERY_S,
        collect_batch: int = COLLECT_BATCH,
    ):
        if cap_bytes is not None and cap_bytes <= 0:
            raise ValueError("the log cap must be a positive number of bytes")
        if retention_s is not None and retention_s <= 0:
            raise ValueError("the logs retention must be positive")
        self.files = files  # store.jobfiles.JobFiles
        self.legacy = LogStore(legacy_root) if legacy_root is not None else None
        self.root = legacy_root  # what the storage sampler counts on disk (legacy only)
        self.cap_bytes, self.retention_s = cap_bytes, retention_s
        self.collect_every_s, self.collect_batch = collect_every_s, collect_batch
        self._last_collect = float("-inf")

    def offset(self, job_id: str, attempt: int, rank: int) -> int:
        return self.files.log_size(job_id, attempt, rank)

    def append(
        self, job_id: str, attempt: int, rank: int, data: bytes, at: int | None = None
    ) -> None:
        """Store `data`, pulled from the worker's log at offset `at` (None: where the log
        ends now), once: bytes another replica stored meanwhile are not stored again."""
        if data:
            if at is None:
                at = self.offset(job_id, attempt, rank)
            self.files.append_log(job_id, attempt, rank, at, data, cap=self.cap_bytes)

    def read(
        self, job_id: str, attempt: int, rank: int, offset: int = 0, limit: int = 1 << 20
    ) -> bytes:
        return self.read_from(job_id, attempt, rank, offset, limit)[0]

    def read_from(
        self, job_id: str, attempt: int, rank: int, offset: int = 0, limit: int = 1 << 20
    ) -> tuple[bytes, int]:
        """Up to `limit` bytes from `offset`, and the offset to read next. Bytes the cap
        dropped read as one marker line (dropped_marker), then the log goes on."""
        begins, data = self.files.read_log(job_id, attempt, rank, offset, limit)
        if not data and self.legacy is not None and not self.offset(job_id, attempt, rank):
            return self.legacy.read_from(job_id, attempt, rank, offset, limit)
        if data and begins > offset:
            return dropped_marker(begins - offset) + data, begins + len(data)
        return data, offset + len(data)

    def attempts(self, job_id: str) -> list[int]:
        found = set(self.files.log_attempts(job_id))
        return sorted(found | set(self.legacy.attempts(job_id) if self.legacy else ()))

    def removed(self, job_id: str) -> str | None:
        """Why the job's logs are gone (the retention deleted them); None when they are not."""
        return self.files.logs_removed(job_id)

    def collect(self, max_batches: int = 10, budget_s: float = 0.5) -> int:
        """The leader's garbage collection (jobs_loop): delete the logs of jobs that ended
        more than `retention_s` ago, `collect_batch` chunks per transaction, at most
        `max_batches` transactions and about `budget_s` per call (the loop's tick waits on
        it); at most every `collect_every_s` once nothing is left. The chunks deleted."""
        now = self.files.clock()
        if self.retention_s is None or now - self._last_collect < self.collect_every_s:
            return 0
        why = f"the job ended more than {_days(self.retention_s)} ago (logs retention)"
        total, began = 0, time.monotonic()
        for _ in range(max_batches):
            n, job = self.files.collect_ended_logs(now - self.retention_s, self.collect_batch, why)
            total += n
            if job is None:
                self._last_collect = now
                break
            if time.monotonic() - began > budget_s:
                break
        return total


def _days(seconds: float) -> str:
    days = seconds / 86400
    if days < 1:
        return f"{seconds:g} s"
    return f"{days:g} day" + "s" * (days != 1)
