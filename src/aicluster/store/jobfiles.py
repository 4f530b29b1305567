"""Working directories and workers' logs kept in the state store (jobfiles_schema), shared
by every control-plane replica.

Invariants: a workdir is written once under a fresh ref before the job that names it
exists, and deleted only once that job has ended; a rank's log only grows, its length is
the end of its last chunk, and appending at any other offset changes nothing (a replica
whose offset is stale loses the race and re-reads the length), so pulls stay idempotent
across leader changes as with the files they replace.
"""

from __future__ import annotations

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError

from aicluster.core.lifecycle import TERMINAL
from aicluster.store.db import Store
from aicluster.store.jobfiles_schema import LogChunkRow, WorkdirRow
from aicluster.store.schema import JobRow


class JobFiles:
    """Shares the engine, session factory and clock of a `Store`."""

    def __init__(self, store: Store):
        self._session = store._session
        self.clock = store.clock

    # -- working directories ----------------------------------------------------------

    def put_workdir(self, ref: str, data: bytes) -> None:
        with self._session.begin() as s:
            s.add(WorkdirRow(ref=ref, data=data, size=len(data), created_at=self.clock()))

    def workdir(self, ref: str) -> bytes | None:
        with self._session() as s:
            return s.scalar(select(WorkdirRow.data).where(WorkdirRow.ref == ref))

    def delete_ended_workdirs(self) -> int:
        """Delete the workdirs of jobs that ended (SUCCEEDED, FAILED, CANCELLED)."""
        ended = select(JobRow.workdir).where(
            JobRow.status.in_([s.value for s in TERMINAL]), JobRow.workdir.is_not(None)
        )
        with self._session.begin() as s:
            return s.execute(delete(WorkdirRow).where(WorkdirRow.ref.in_(ended))).rowcount

    # -- logs -------------------------------------------------------------------------

    @staticmethod
    def _key(job_id: str, attempt: int, rank: int) -> list:
        return [
            LogChunkRow.job_id == job_id,
            LogChunkRow.attempt == attempt,
            LogChunkRow.rank == rank,
        ]

    def log_size(self, job_id: str, attempt: int, rank: int) -> int:
        with self._session() as s:
            return self._end(s, job_id, attempt, rank)

    def append_log(self, job_id: str, attempt: int, rank: int, offset: int, data: bytes) -> bool:
        """Add `data` at `offset` if that is where the log ends; False when it is not (or
        another replica added the same bytes first)."""
        if not data:
            return True
        try:
            with self._session.begin() as s:
                end = self._end(s, job_id, attempt, rank)
                if end != offset:
                    return False
                s.add(
                    LogChunkRow(
                        job_id=job_id,
                        attempt=attempt,
                        rank=rank,
                        offset=offset,
                        size=len(data),
                        data=data,
                        created_at=self.clock(),
                    )
                )
            return True
        except IntegrityError:  # the same offset written by another replica meanwhile
            return False

    def _end(self, s, job_id: str, attempt: int, rank: int) -> int:
        last = s.execute(
            select(LogChunkRow.offset, LogChunkRow.size)
            .where(*self._key(job_id, attempt, rank))
            .order_by(LogChunkRow.offset.desc())
            .limit(1)
        ).first()
        return 0 if last is None else last.offset + last.size

    def read_log(self, job_id: str, attempt: int, rank: int, offset: int, limit: int) -> bytes:
        with self._session() as s:
            rows = s.execute(
                select(LogChunkRow.offset, LogChunkRow.data)
                .where(
                    *self._key(job_id, attempt, rank),
                    LogChunkRow.offset + LogChunkRow.size > offset,
                    LogChunkRow.offset < offset + limit,
                )
                .order_by(LogChunkRow.offset)
            ).all()
        out = b"".join(bytes(r.data) for r in rows)
        start = offset - rows[0].offset if rows else 0
        return out[start : start + limit]

    def log_attempts(self, job_id: str) -> list[int]:
        with self._session() as s:
            found = s.scalars(
                select(LogChunkRow.attempt).where(LogChunkRow.job_id == job_id).distinct()
            ).all()
        return sorted(found)

    def log_bytes(self, job_ids: list[str]) -> int:
        """The logs' size of these jobs (all attempts and ranks)."""
        if not job_ids:
            return 0
        with self._session() as s:
            total = s.scalar(
                select(func.coalesce(func.sum(LogChunkRow.size), 0)).where(
                    LogChunkRow.job_id.in_(job_ids)
                )
            )
        return int(total or 0)
