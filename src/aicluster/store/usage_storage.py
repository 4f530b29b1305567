"""Storage samples in the usage ledger: the bytes each team keeps, of each kind, once a UTC
day (control.usage_storage takes them).

Vocabulary: a *sample* is (day, team, kind, bytes); kinds are `artifacts` (datasets and
models), `checkpoints` (checkpoint artifacts) and `logs` (its jobs' and replicas' logs).
Invariants: one row per (day, team, kind): a day's sample replaces that day's rows in
one transaction, so sampling again (after a crash, on demand) never counts twice and a
team that no longer keeps anything loses its row of the day; a day's rows are all from
one sample. A sample stands for the whole UTC day it was taken on (GiB-days).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sqlalchemy import delete, func, insert, select

from aicluster.store.artifacts.schema import ArtifactRow, ArtifactVersionRow
from aicluster.store.db import Store
from aicluster.store.jobfiles_schema import LogChunkRow
from aicluster.store.jobs import fields_of
from aicluster.store.schema import JobRow
from aicluster.store.usage_schema import StorageSampleRow, UsageReplicaRunRow

DAY = 86400
KINDS = ("artifacts", "checkpoints", "logs")


@dataclass(frozen=True)
class StorageSample:
    day: int
    team: str
    kind: str
    bytes: int
    sampled_at: float

    @classmethod
    def of(cls, row: StorageSampleRow) -> StorageSample:
        return cls(**fields_of(cls, row))


class StorageSamples:
    """Shares the engine, session factory and clock of a `Store`."""

    def __init__(self, store: Store):
        self.store = store
        self._session = store._session
        self.clock = store.clock

    def today(self) -> int:
        return math.floor(self.clock() / DAY)

    def put(self, day: int, samples: dict[tuple[str, str], int]) -> int:
        """Replace the samples of `day` with (team, kind) -> bytes; the rows written."""
        now = self.clock()
        rows = [
            dict(day=day, team=team, kind=kind, bytes=int(n), sampled_at=now)
            for (team, kind), n in sorted(samples.items())
            if n > 0
        ]
        with self._session.begin() as s:
            s.execute(delete(StorageSampleRow).where(StorageSampleRow.day == day))
            if rows:
                s.execute(insert(StorageSampleRow), rows)
        return len(rows)

    def last_day(self) -> int | None:
        """The latest day sampled (None: never)."""
        with self._session() as s:
            return s.scalar(select(func.max(StorageSampleRow.day)))

    def samples(self, first_day: int | None, team: str | None) -> list[StorageSample]:
        """The samples from `first_day` on (of `team`), oldest first."""
        q = select(StorageSampleRow).order_by(StorageSampleRow.day, StorageSampleRow.id)
        if first_day is not None:
            q = q.where(StorageSampleRow.day >= first_day)
        if team is not None:
            q = q.where(StorageSampleRow.team == team)
        with self._session() as s:
            return [StorageSample.of(r) for r in s.scalars(q)]

    def latest(self, team: str | None) -> list[StorageSample]:
        """Each team's samples of the latest day it was sampled on."""
        S = StorageSampleRow
        last = select(S.team, func.max(S.day).label("day")).group_by(S.team)
        if team is not None:
            last = last.where(S.team == team)
        last = last.subquery()
        q = select(S).join(last, (S.team == last.c.team) & (S.day == last.c.day))
        with self._session() as s:
            return [StorageSample.of(r) for r in s.scalars(q.order_by(S.team, S.kind))]

    # -- what there is to sample --------------------------------------------------------

    def artifact_manifests(self) -> dict[tuple[str, str], set[str]]:
        """(team, storage kind) -> the manifest digests of its live artifact versions."""
        q = select(ArtifactRow.team, ArtifactRow.kind, ArtifactVersionRow.manifest_sha256).join(
            ArtifactVersionRow, ArtifactVersionRow.artifact_id == ArtifactRow.id
        )
        out: dict[tuple[str, str], set[str]] = {}
        with self._session() as s:
            for team, kind, digest in s.execute(q):
                key = (team, "checkpoints" if kind == "checkpoint" else "artifacts")
                out.setdefault(key, set()).add(digest)
        return out

    def stored_log_sizes(self) -> dict[str, int]:
        """Bytes of the logs kept in the state store (store.jobfiles), per job or gang id."""
        q = select(LogChunkRow.job_id, func.sum(LogChunkRow.size)).group_by(LogChunkRow.job_id)
        with self._session() as s:
            return {job_id: int(n or 0) for job_id, n in s.execute(q)}

    def owners(
        self, job_ids: list[str], replica_ids: list[str]
    ) -> tuple[dict[str, str], dict[str, str]]:
        """The team of each of these jobs, and of each of these replica runs, that the
        store knows."""
        jobs: dict[str, str] = {}
        runs: dict[str, str] = {}
        R = UsageReplicaRunRow
        with self._session() as s:
            for i in range(0, len(job_ids), 500):
                q = select(JobRow.id, JobRow.team).where(JobRow.id.in_(job_ids[i : i + 500]))
                jobs.update((k, v) for k, v in s.execute(q))
            for i in range(0, len(replica_ids), 500):
                q = select(R.replica_id, R.team).where(R.replica_id.in_(replica_ids[i : i + 500]))
                runs.update((k, v) for k, v in s.execute(q))
        return jobs, runs
