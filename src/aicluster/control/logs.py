"""Worker logs kept by the control plane: per job (or replica gang), attempt and rank.

`LogStore` keeps them in files under one folder (one control plane, and the unit tests);
`SharedLogStore` in the state store (store.jobfiles), where every control-plane replica,
on any machine, reads what the leader pulled: the API server uses it. Both have the same
methods.

Invariant: a log only grows, and its size is the offset of the next byte to pull from the
worker, so pulling is idempotent across control-plane restarts and leader changes.
"""

from __future__ import annotations

import re
from pathlib import Path


class LogStore:
    def __init__(self, root: Path):
        self.root = root

    def path(self, job_id: str, attempt: int, rank: int) -> Path:
        return self.root / job_id / f"a{attempt}" / f"rank-{rank}.log"

    def offset(self, job_id: str, attempt: int, rank: int) -> int:
        p = self.path(job_id, attempt, rank)
        return p.stat().st_size if p.exists() else 0

    def append(self, job_id: str, attempt: int, rank: int, data: bytes) -> None:
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


class SharedLogStore:
    """Logs in the state store. `legacy_root`: the folder of an installation's logs from
    before they moved there, still read (never written) for the attempts it holds."""

    def __init__(self, files, legacy_root: Path | None = None):
        self.files = files  # store.jobfiles.JobFiles
        self.legacy = LogStore(legacy_root) if legacy_root is not None else None
        self.root = legacy_root  # what the storage sampler counts on disk (legacy only)

    def offset(self, job_id: str, attempt: int, rank: int) -> int:
        return self.files.log_size(job_id, attempt, rank)

    def append(self, job_id: str, attempt: int, rank: int, data: bytes) -> None:
        """Add `data` where the log ends as this replica read it just before (offset()):
        a replica that lost a race with another changes nothing and re-reads next time."""
        if data:
            self.files.append_log(job_id, attempt, rank, self.offset(job_id, attempt, rank), data)

    def read(
        self, job_id: str, attempt: int, rank: int, offset: int = 0, limit: int = 1 << 20
    ) -> bytes:
        data = self.files.read_log(job_id, attempt, rank, offset, limit)
        if not data and self.legacy is not None and not self.offset(job_id, attempt, rank):
            return self.legacy.read(job_id, attempt, rank, offset, limit)
        return data

    def attempts(self, job_id: str) -> list[int]:
        found = set(self.files.log_attempts(job_id))
        return sorted(found | set(self.legacy.attempts(job_id) if self.legacy else ()))
