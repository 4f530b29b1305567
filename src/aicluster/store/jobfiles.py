"""Working directories and workers' logs kept in the state store (jobfiles_schema), shared
by every control-plane replica.

Invariants: a workdir is written once under a fresh ref before the job that names it
exists, and deleted only once that job has ended; a rank's log only grows, its length is
the end of its last chunk, and bytes pulled from the worker at offset `at` are stored only
past that end (compare-and-set on the end: bytes it already holds are dropped, a stale
writer keeps at most its new tail, a gap stores nothing), so every byte is stored once
however many replicas pull it, and pulls stay idempotent across leader changes.

Bounds: with a cap, a log keeps its newest chunks only (the oldest dropped whole once the
rest holds `cap` bytes; its *start*, the first kept chunk's offset, then moves up); the
logs of jobs that ended before a cutoff are deleted a bounded batch of chunks per
transaction, and the job gets a `LogsRemoved` event once none is left.
"""

from __future__ import annotations

from sqlalchemy import delete, exists, func, select
from sqlalchemy.exc import IntegrityError

from aicluster.core.lifecycle import TERMINAL
from aicluster.store.db import Store
from aicluster.store.jobfiles_schema import LogChunkRow, WorkdirRow
from aicluster.store.schema import EventRow, JobRow

LOGS_REMOVED = "LogsRemoved"  # the event of a job whose logs the retention deleted


class JobFiles:
    """Shares the engine, session factory and clock of a `Store`."""

    def __init__(self, store: Store):
        self.store = store
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

    def append_log(
        self, job_id: str, attempt: int, rank: int, at: int, data: bytes, cap: int | None = None
    ) -> int:
        """Store `data`, pulled from the worker's log at offset `at`, past the log's end:
        the bytes the log already has are dropped, the rest appended. The number of bytes
        stored (0: all were there already, or `at` is past the end). `cap`: drop the
        oldest chunks while the others hold at least `cap` bytes."""
        for _ in range(3):  # a concurrent writer took the same end: re-read it
            try:
                with self._session.begin() as s:
                    end = self._end(s, job_id, attempt, rank)
                    new = data[end - at :] if at <= end else b""
                    if not new:
                        return 0
                    s.add(
                        LogChunkRow(
                            job_id=job_id,
                            attempt=attempt,
                            rank=rank,
                            offset=end,
                            size=len(new),
                            data=new,
                            created_at=self.clock(),
                        )
                    )
                    if cap is not None:
                        self._trim(s, job_id, attempt, rank, end + len(new) - cap)
                return len(new)
            except IntegrityError:
                continue
        return 0

    def _trim(self, s, job_id: str, attempt: int, rank: int, keep_from: int) -> None:
        """Delete the chunks that end at or before `keep_from` (never the last one)."""
        if keep_from <= 0:
            return
        first = s.scalar(
            select(func.min(LogChunkRow.offset)).where(*self._key(job_id, attempt, rank))
        )
        if first is None or first >= keep_from:
            return
        s.execute(
            delete(LogChunkRow)
            .where(
                *self._key(job_id, attempt, rank),
                LogChunkRow.offset < keep_from,
                LogChunkRow.offset + LogChunkRow.size <= keep_from,
            )
            .execution_options(synchronize_session=False)
        )

    def _end(self, s, job_id: str, attempt: int, rank: int) -> int:
        last = s.execute(
            select(LogChunkRow.offset, LogChunkRow.size)
            .where(*self._key(job_id, attempt, rank))
            .order_by(LogChunkRow.offset.desc())
            .limit(1)
        ).first()
        return 0 if last is None else last.offset + last.size

    def read_log(
        self, job_id: str, attempt: int, rank: int, offset: int, limit: int
    ) -> tuple[int, bytes]:
        """Up to `limit` bytes from `offset`, or from the log's start when the cap dropped
        the bytes at `offset`: (where the bytes begin, the bytes)."""
        with self._session() as s:
            first = s.scalar(
                select(func.min(LogChunkRow.offset)).where(*self._key(job_id, attempt, rank))
            )
            offset = max(offset, first or 0)
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
        return offset, out[start : start + limit]

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

    # -- retention ----------------------------------------------------------------------

    def collect_ended_logs(
        self, ended_before: float, batch: int, why: str
    ) -> tuple[int, str | None]:
        """One transaction: delete up to `batch` of the oldest chunks of one log of a job
        that ended before `ended_before`; when the job has none left, add its LogsRemoved
        event (message `why`). (chunks deleted, the job's id); (0, None): nothing to do."""
        ended = select(JobRow.id, JobRow.team).where(
            JobRow.status.in_([s.value for s in TERMINAL]),
            JobRow.finished_at < ended_before,
            exists().where(LogChunkRow.job_id == JobRow.id),
        )
        with self._session.begin() as s:
            job = s.execute(ended.limit(1)).first()
            if job is None:
                return 0, None
            log = s.execute(
                select(LogChunkRow.attempt, LogChunkRow.rank)
                .where(LogChunkRow.job_id == job.id)
                .limit(1)
            ).first()
            key = self._key(job.id, log.attempt, log.rank)
            last = s.scalar(
                select(LogChunkRow.offset)
                .where(*key)
                .order_by(LogChunkRow.offset)
                .offset(batch - 1)
                .limit(1)
            )
            gone = delete(LogChunkRow).where(*key)
            if last is not None:
                gone = gone.where(LogChunkRow.offset <= last)
            n = s.execute(gone.execution_options(synchronize_session=False)).rowcount
            if not s.scalar(select(exists().where(LogChunkRow.job_id == job.id))):
                self.store._event(s, "job", job.id, job.team, LOGS_REMOVED, message=why)
            return n, job.id

    def logs_removed(self, job_id: str) -> str | None:
        """The message of the job's LogsRemoved event, None when its logs were not removed."""
        with self._session() as s:
            return s.scalar(
                select(EventRow.message)
                .where(EventRow.object_id == job_id, EventRow.type == LOGS_REMOVED)
                .order_by(EventRow.id.desc())
                .limit(1)
            )
