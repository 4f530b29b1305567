"""Worker logs kept by the control plane: one file per job, attempt and rank.

Invariant: a file only grows, and its size is the offset of the next byte to pull
from the worker, so pulling is idempotent across control-plane restarts.
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
