"""Replica runs in the usage ledger: the facts a run's line is made from.

Vocabulary: a *run* is one replica from its placement (PENDING -> STARTING) to its end
(STOPPED or FAILED from STARTING or READY); a replica id names one run on one node, never
restarted in place (core.replica). A replica stopped while PENDING never held anything
and has no line.

Invariants: the run's facts (service, team, who deployed it, node, the resources one
replica holds) are written in the transaction that places it, so its line can be made
from its end event even after its service and replica rows are gone; its line is keyed
by (`replica:` + id, 1), the replica's workload id, so accounting twice never counts twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from aicluster.core.replica import ReplicaId, ReplicaStatus
from aicluster.specs.service import ServiceSpec
from aicluster.store.jobs import fields_of
from aicluster.store.usage_schema import UsageLineRow, UsageReplicaRunRow

KIND = "replica"
_HELD = (ReplicaStatus.STARTING.value, ReplicaStatus.READY.value)
_ENDS = (ReplicaStatus.STOPPED.value, ReplicaStatus.FAILED.value)
# A replica's ends that lose work it did not choose to lose (a drained replica stops
# only after its replacement is READY: nothing is lost).
LOST = ("preempted", "node_lost", "worker_lost")


@dataclass(frozen=True)
class ReplicaRun:
    replica_id: str
    service: str
    team: str
    user: str
    node_id: str | None
    gpus: int
    cpus: float
    memory: int
    gpu_model: str | None
    placed_at: float

    @classmethod
    def of(cls, row: UsageReplicaRunRow) -> ReplicaRun:
        return cls(**fields_of(cls, row))


@dataclass(frozen=True)
class RunEnd:
    """A run's end, from its transition event."""

    replica_id: str
    ended_at: float
    end_reason: str | None


# make_replica_line(run, end, prices) -> the new line's columns (no key or accounted_at)
ReplicaLineMaker = Callable[[ReplicaRun, RunEnd, list], dict]


def record_run(s: Session, replica_id: str, team: str, service, node_id, placed_at) -> None:
    """Record a run's facts at its placement, in the transaction that places it (`service`:
    its ServiceRow, whose spec says what one replica holds); a run recorded already is
    left as it is."""
    if s.get(UsageReplicaRunRow, replica_id) is not None:
        return
    res = ServiceSpec.model_validate(service.spec).resources
    s.add(
        UsageReplicaRunRow(
            replica_id=replica_id,
            service=service.name,
            team=team,
            user=service.owner,
            node_id=node_id,
            gpus=res.gpus,
            cpus=res.cpus,
            memory=res.memory,
            gpu_model=res.gpu_model,
            placed_at=placed_at,
        )
    )


def run_ends(rows) -> dict[str, RunEnd]:
    """The ends of runs among event rows (id, kind, object_id, type, from/to status, ts,
    reason), by replica id."""
    return {
        r.object_id: RunEnd(r.object_id, r.ts, r.reason)
        for r in rows
        if r.kind == "replica"
        and r.type == "ReplicaTransition"
        and r.from_status in _HELD
        and r.to_status in _ENDS
    }


def account_runs(
    s: Session, ends: dict[str, RunEnd], make_line: ReplicaLineMaker, prices: list
) -> list[dict]:
    """The new lines of these ended runs: one per run that has none yet (two queries for
    the batch). A run without recorded facts (none ever placed it) has no line."""
    keys = {ReplicaId(rid).workload_id: rid for rid in ends}
    runs = {
        r.replica_id: ReplicaRun.of(r)
        for r in s.scalars(
            select(UsageReplicaRunRow).where(UsageReplicaRunRow.replica_id.in_(list(ends)))
        )
    }
    done = set(
        s.scalars(
            select(UsageLineRow.job_id).where(
                UsageLineRow.job_id.in_(list(keys)), UsageLineRow.attempt == 1
            )
        )
    )
    new = []
    for key, rid in keys.items():
        if key in done or rid not in runs:
            continue
        line = make_line(runs[rid], ends[rid], prices)
        new.append(dict(line, job_id=key, attempt=1, kind=KIND, service=runs[rid].service))
    return new
