"""Jobs and events in the state store: compare-and-set transitions along the lifecycle
table (core.lifecycle), each with its event, and records that are plain values."""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from sqlalchemy import Text, cast, func, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from aicluster.core.lifecycle import JobStatus, Reason, RequeueCause
from aicluster.core.model import WaitKind
from aicluster.specs.job import JobSpec
from aicluster.store.cursors import DEFAULT_LIMIT, check_limit, decode, page_of
from aicluster.store.errors import Conflict, NotFound
from aicluster.store.schema import EventRow, JobRow, TeamRow
from aicluster.store.spec_cache import SPECS


def fields_of(cls, row) -> dict:
    """The row's values for every field of the record dataclass `cls`."""
    return {c: getattr(row, c) for c in cls.__dataclass_fields__}


@dataclass(frozen=True)
class JobRecord:
    id: str
    seq: int
    name: str
    team: str
    owner: str
    spec: JobSpec  # the column holds its JSON; read back, it is the typed spec again
    status: JobStatus
    reason: str | None
    message: str | None
    requeue_cause: RequeueCause | None  # why it last went back to PENDING; None if never
    wait_kind: WaitKind | None  # what a PENDING job waits for (its message says it); else None
    exit_code: int | None
    priority: int
    restarts: int
    attempt: int
    placement: list | None
    workdir: str | None
    created_at: float
    updated_at: float
    started_at: float | None
    finished_at: float | None
    last_checkpoint_at: float | None  # its newest checkpoint (of any attempt), if known

    @classmethod
    def of(cls, row) -> JobRecord:
        """The record of a JobRow, or of a row of `job_query` (its spec as the stored
        text, parsed once per job and text: store.spec_cache).

        Made without the dataclass's __init__ (a frozen one sets each of its 21 fields
        through object.__setattr__): the reconcile loop reads thousands a tick, and this
        takes ~1/4 of the time. The record is the same: every field set, frozen after."""
        text = getattr(row, "spec_text", None)
        if text is not None:  # a job_query row: the columns of _FIELDS in order, then the text
            values = dict(zip(_FIELDS, row))
            values["spec"] = SPECS.spec(values["id"], text)
        else:
            values = {c: getattr(row, c) for c in _FIELDS}
            values["spec"] = JobSpec.model_validate(row.spec)
        values["status"] = _STATUSES[values["status"]]
        cause, kind = values["requeue_cause"], values["wait_kind"]
        values["requeue_cause"] = _CAUSES[cause] if cause else None
        values["wait_kind"] = _KINDS[kind] if kind else None
        return _made(values)

    def with_wait(self, message: str, kind: WaitKind, updated_at: float) -> JobRecord:
        """The record with this wait written (dataclasses.replace, as `of` makes one)."""
        return _made(
            {**self.__dict__, "message": message, "wait_kind": kind, "updated_at": updated_at}
        )


def _made(values: dict) -> JobRecord:
    """A JobRecord of every field's value, without the frozen dataclass's __init__."""
    rec = object.__new__(JobRecord)
    rec.__dict__.update(values)
    return rec


_FIELDS = tuple(c for c in JobRecord.__dataclass_fields__ if c != "spec")
# a column's text -> its enum member (a dict lookup, where calling the enum is ~1 us)
_STATUSES = {s.value: s for s in JobStatus}
_CAUSES = {c.value: c for c in RequeueCause}
_KINDS = {k.value: k for k in WaitKind}


def new_job_values(
    spec: JobSpec, owner: str, job_id: str, now: float, workdir: str | None = None
) -> dict:
    """The columns of a newly submitted (PENDING) job's row."""
    return dict(
        id=job_id,
        name=spec.name,
        team=spec.team,
        owner=owner,
        spec=spec.model_dump(mode="json"),
        status=JobStatus.PENDING.value,
        reason=Reason.SUBMITTED.value,
        priority=spec.priority,
        restarts=0,
        attempt=0,
        workdir=workdir,
        created_at=now,
        updated_at=now,
    )


def job_query(*where):
    """The columns of JobRow as plain rows (no ORM objects), the spec as its stored text:
    `read_jobs` parses each text once per job (store.spec_cache)."""
    cols = [getattr(JobRow, c) for c in _FIELDS]
    q = select(*cols, cast(JobRow.spec, Text).label("spec_text"))
    return q.where(*where) if where else q


def read_jobs(s: Session, q) -> list[JobRecord]:
    """The records of a `job_query`."""
    return [JobRecord.of(row) for row in s.execute(q)]


@dataclass(frozen=True)
class EventRecord:
    id: int
    ts: float
    kind: str
    object_id: str
    team: str | None
    type: str
    from_status: str | None
    to_status: str | None
    reason: str | None
    message: str | None
    actor: str | None
    attempt: int | None = None  # a job transition's: the job's attempt after it
    placement: list | None = None  # an admission's: the node id of each rank
    requeue_cause: str | None = None  # a requeue's: why the attempt ended
    interrupted_at: float | None = None  # an interrupted attempt's end: last sign of progress

    @classmethod
    def of(cls, row: EventRow) -> EventRecord:
        return cls(**fields_of(cls, row))


@dataclass(frozen=True)
class AttemptRecord:
    """One run of a job's gang, read from its transition events (attempts_of)."""

    attempt: int
    placement: list  # node id per rank
    admitted_at: float
    started_at: float | None  # RUNNING; None when it never got there (launch failed)
    ended_at: float | None  # None while it runs
    end_reason: str | None  # the requeue cause or the final reason; None while it runs
    # An interrupted attempt (its node died, its worker vanished): when it stopped making
    # progress, at most one tick before the death; None for any other end.
    interrupted_at: float | None = None

    def runtime_s(self, now: float) -> float | None:
        if self.started_at is None:
            return None
        return max(0.0, (self.ended_at if self.ended_at is not None else now) - self.started_at)


_IN_ATTEMPT = (JobStatus.ADMITTED.value, JobStatus.RUNNING.value)


def attempts_of(events: Iterable[EventRecord]) -> list[AttemptRecord]:
    """Every attempt of a job from its events in order: an admission opens one, RUNNING
    starts it, the next transition out of ADMITTED/RUNNING ends it. Events written before
    they carried attempts and placements (revision 0011) count admissions instead."""
    out: list[dict] = []
    for e in events:
        if e.type != "JobTransition":
            continue
        if e.to_status == JobStatus.ADMITTED.value:
            out.append(
                dict(
                    attempt=e.attempt or len(out) + 1,
                    placement=list(e.placement or []),
                    admitted_at=e.ts,
                    started_at=None,
                    ended_at=None,
                    end_reason=None,
                    interrupted_at=None,
                )
            )
        elif out and out[-1]["ended_at"] is None and e.from_status in _IN_ATTEMPT:
            if e.to_status == JobStatus.RUNNING.value:
                out[-1]["started_at"] = e.ts
            else:
                out[-1]["ended_at"] = e.ts
                out[-1]["end_reason"] = _end_reason(e)
                out[-1]["interrupted_at"] = e.interrupted_at
    return [AttemptRecord(**a) for a in out]


def _end_reason(e: EventRecord) -> str | None:
    if e.reason != Reason.REQUEUED.value:
        return e.reason
    if e.requeue_cause:
        return e.requeue_cause
    head = (e.message or "").split(":", 1)[0]  # older events: "node_lost: rank 0: ..."
    causes = {c.value for c in RequeueCause}
    return head if head in causes else e.reason


class Move(NamedTuple):
    """One compare-and-set transition (`JobStore.transition`'s arguments): `fields`,
    other columns set with it (placement, attempt, restarts, exit_code)."""

    job_id: str
    src: JobStatus
    dst: JobStatus
    reason: Reason
    message: str | None = None
    actor: str | None = None
    requeue_cause: RequeueCause | None = None
    interrupted_at: float | None = None
    fields: dict = {}


def move_values(m: Move, now: float) -> dict:
    """The columns a transition sets."""
    values = dict(
        status=m.dst.value, reason=m.reason.value, message=m.message, wait_kind=None, updated_at=now
    )
    if m.requeue_cause is not None:
        values["requeue_cause"] = m.requeue_cause.value
    if m.dst == JobStatus.RUNNING:
        values["started_at"] = now
    if m.dst.terminal:
        values["finished_at"] = now
    values.update(m.fields)
    return values


class JobStore:
    """Jobs and the event log; mixed into store.db.Store (its session and clock), with
    store.job_writes.JobWrites (the batched writes `transition` is one of)."""

    # -- jobs -------------------------------------------------------------------

    def create_job(self, spec: JobSpec, owner: str, workdir: str | None = None) -> JobRecord:
        for _ in range(5):  # the id's random suffix may, rarely, be taken
            try:
                return self._create_job(spec, owner, workdir)
            except IntegrityError:
                continue
        raise Conflict(f"could not allocate an id for job {spec.name!r}")

    def create_jobs(
        self, specs: list[JobSpec], owner: str, workdir: str | None = None
    ) -> list[JobRecord]:
        """`create_job` for each spec, in order, in one transaction: all or none (each
        team looked up once, the rows and their events inserted together at commit)."""
        for _ in range(5):
            try:
                with self._session.begin() as s:
                    for team in dict.fromkeys(spec.team for spec in specs):
                        if s.get(TeamRow, team) is None:
                            raise NotFound(f"team {team!r} does not exist")
                    rows = [self._add_job(s, spec, owner, workdir) for spec in specs]
                    s.flush()  # one INSERT of them all; each row gets its seq
                    return [JobRecord.of(row) for row in rows]
            except IntegrityError:
                continue
        raise Conflict(f"could not allocate ids for {len(specs)} jobs")

    def _create_job(self, spec: JobSpec, owner: str, workdir: str | None) -> JobRecord:
        with self._session.begin() as s:
            if s.get(TeamRow, spec.team) is None:
                raise NotFound(f"team {spec.team!r} does not exist")
            row = self._add_job(s, spec, owner, workdir)
            s.flush()
            return JobRecord.of(row)

    def _add_job(self, s, spec: JobSpec, owner: str, workdir: str | None) -> JobRow:
        """Add a PENDING job and its JobSubmitted event to `s` (its team checked)."""
        job_id = f"{spec.name}-{secrets.token_hex(3)}"
        row = JobRow(**new_job_values(spec, owner, job_id, self.clock(), workdir))
        s.add(row)
        self._event(
            s,
            "job",
            row.id,
            row.team,
            "JobSubmitted",
            None,
            "PENDING",
            Reason.SUBMITTED,
            f"{spec.workers} worker(s)",
            owner,
        )
        return row

    def get_job(self, job_id: str) -> JobRecord | None:
        with self._session() as s:
            found = read_jobs(s, job_query(JobRow.id == job_id))
            return found[0] if found else None

    def newest_jobs_named(self, name: str, team: str | None = None) -> list[JobRecord]:
        """The newest job called `name` in each team that has one (in `team` alone when
        given), newest first. One query on the (name, team) index: `seq` orders submissions,
        so the greatest `seq` per team is its newest job of that name."""
        newest = select(func.max(JobRow.seq)).where(JobRow.name == name)
        if team is not None:
            newest = newest.where(JobRow.team == team)
        q = job_query(JobRow.seq.in_(newest.group_by(JobRow.team)))
        with self._session() as s:
            return read_jobs(s, q.order_by(JobRow.seq.desc()))

    def get_jobs(self, job_ids: Iterable[str]) -> list[JobRecord]:
        """The jobs of these ids that exist (any order), in batches on the id index."""
        ids = sorted(set(job_ids))
        out: list[JobRecord] = []
        with self._session() as s:
            for i in range(0, len(ids), 500):
                out += read_jobs(s, job_query(JobRow.id.in_(ids[i : i + 500])))
        return out

    def jobs_changed_since(self, after: int) -> tuple[set[str], int]:
        """The ids of the jobs that changed after event id `after` (every write to a job
        writes its event in the same transaction: submit, transition, wait message), and
        the event id to pass next time. Never past the event horizon, so none is missed."""
        top = max(after, self.event_mark())
        with self._session() as s:
            q = (
                select(EventRow.object_id)
                .where(EventRow.id > after, EventRow.id <= top, EventRow.kind == "job")
                .distinct()
            )
            return set(s.scalars(q)), top

    def job_versions(self, *statuses: JobStatus) -> dict[str, float]:
        """id -> updated_at of every job in one of `statuses` (every write to a job sets
        its updated_at): what a cache of those jobs checks itself against without reading
        them (control.pending_jobs, control.active_jobs)."""
        q = select(JobRow.id, JobRow.updated_at).where(
            JobRow.status.in_([s.value for s in statuses])
        )
        with self._session() as s:
            return {i: at for i, at in s.execute(q)}

    def event_mark(self) -> int:
        """The greatest event id a reader may move its cursor to now (the event horizon;
        on SQLite the greatest id): every event at or below it is committed."""
        horizon = self.event_horizon()
        if horizon is not None:
            return horizon
        with self._session() as s:
            return s.scalar(select(func.max(EventRow.id))) or 0

    def list_jobs(
        self,
        team: str | None = None,
        statuses: Iterable[JobStatus] | None = None,
        limit: int | None = 1000,
    ) -> list[JobRecord]:
        """Newest first; `limit` None: every one (the reconcile loop must see them all)."""
        q = job_query().order_by(JobRow.seq.desc()).limit(limit)
        if team is not None:
            q = q.where(JobRow.team == team)
        if statuses is not None:
            q = q.where(JobRow.status.in_([st.value for st in statuses]))
        with self._session() as s:
            return read_jobs(s, q)

    def page_jobs(
        self,
        team: str | None = None,
        statuses: Iterable[JobStatus] | None = None,
        limit: int = DEFAULT_LIMIT,
        cursor: str | None = None,
    ) -> tuple[list[JobRecord], str | None]:
        """A page of jobs newest first and the next page's cursor (store.cursors): a keyset
        read on `seq` (ix_jobs_status_seq, ix_jobs_team_seq); BadCursor for a bad cursor."""
        (before,) = decode(cursor, "jobs", int) or (None,)
        q = job_query().order_by(JobRow.seq.desc()).limit(check_limit(limit) + 1)
        if before is not None:
            q = q.where(JobRow.seq < before)
        if team is not None:
            q = q.where(JobRow.team == team)
        if statuses is not None:
            q = q.where(JobRow.status.in_([st.value for st in statuses]))
        with self._session() as s:
            rows = read_jobs(s, q)
        return page_of(rows, limit, "jobs", lambda j: (j.seq,))

    def transition(
        self,
        job_id: str,
        src: JobStatus,
        dst: JobStatus,
        reason: Reason,
        message: str | None = None,
        actor: str | None = None,
        requeue_cause: RequeueCause | None = None,
        interrupted_at: float | None = None,
        **fields,
    ) -> JobRecord | None:
        """Compare-and-set the status; write the Event in the same transaction.

        A requeue (reason `requeued`) names its `requeue_cause`; it stays on the job until
        the next requeue. An attempt that ends interrupted records on its event
        `interrupted_at`, when it stopped making progress. Every transition clears the wait
        kind (the scheduler sets it again while the job is PENDING). Returns the new
        record, or None when the job was no longer in `src`.
        """
        move = Move(job_id, src, dst, reason, message, actor, requeue_cause, interrupted_at)
        return self.transitions([move._replace(fields=fields)])[0]

    def set_wait_message(self, job_id: str, message: str, kind: WaitKind) -> bool:
        """Record why a PENDING job waits (the sentence and its kind); an Event (its reason:
        the kind) only when either changes."""
        with self._session.begin() as s:
            row = s.scalars(select(JobRow).where(JobRow.id == job_id)).first()
            if row is None or row.status != JobStatus.PENDING.value:
                return False
            if row.message == message and row.wait_kind == kind.value:
                return False
            row.message = message
            row.wait_kind = kind.value
            row.updated_at = self.clock()
            self._event(
                s, "job", job_id, row.team, "JobWaiting", reason=kind.value, message=message
            )
            return True

    def set_running_message(
        self,
        job_id: str,
        attempt: int,
        message: str,
        event: str | None = None,
        reason=None,
        status: JobStatus = JobStatus.RUNNING,
    ) -> bool:
        """Say what a job's attempt is doing while it is in `status` (RUNNING: building
        its environment; ADMITTED: fetching its inputs); an Event of type `event` with it
        when given. Nothing when the job has moved on."""
        with self._session.begin() as s:
            row = s.scalars(select(JobRow).where(JobRow.id == job_id)).first()
            if row is None or row.status != status.value or row.attempt != attempt:
                return False
            row.message = message
            row.updated_at = self.clock()
            if event is not None:
                self._event(
                    s,
                    "job",
                    job_id,
                    row.team,
                    event,
                    reason=reason,
                    message=message,
                    attempt=attempt,
                )
            return True

    # -- events -----------------------------------------------------------------

    def mark_checkpoint(self, job_id: str, at: float, what: str) -> bool:
        """Record that the active job `job_id` saved a checkpoint at `at` (`what` names
        it), with a JobCheckpointed event (the loop's caches re-read the job: its next
        snapshot knows what stopping it would lose); False when it is not active."""
        with self._session.begin() as s:
            row = s.scalars(select(JobRow).where(JobRow.id == job_id)).first()
            if row is None or row.status not in _IN_ATTEMPT:
                return False
            row.last_checkpoint_at = max(at, row.last_checkpoint_at or at)
            self._event(s, "job", job_id, row.team, "JobCheckpointed", message=what)
        return True

    def add_event(self, kind: str, object_id: str, team: str | None, type_: str, **kw) -> None:
        with self._session.begin() as s:
            self._event(s, kind, object_id, team, type_, **kw)

    def _event(self, s: Session, *args, **kw) -> EventRow:
        """Add an Event to `s` (the arguments of `_event_values`); its id once flushed."""
        row = EventRow(**self._event_values(*args, **kw))
        s.add(row)
        return row

    def _event_values(
        self,
        kind,
        object_id,
        team,
        type_,
        from_status=None,
        to_status=None,
        reason=None,
        message=None,
        actor=None,
        attempt=None,
        placement=None,
        requeue_cause=None,
        interrupted_at=None,
    ) -> dict:
        """An Event's columns (for an ORM row, or for a Core insert of many at once)."""
        return dict(
            ts=self.clock(),
            kind=kind,
            object_id=object_id,
            team=team,
            type=type_,
            from_status=from_status,
            to_status=to_status,
            reason=str(reason) if reason else None,
            message=message,
            actor=actor,
            attempt=attempt,
            placement=placement,
            requeue_cause=requeue_cause,
            interrupted_at=interrupted_at,
        )

    def job_attempts(self, job_id: str) -> list[AttemptRecord]:
        """The job's attempts, oldest first, from all its transition events."""
        q = (
            select(EventRow)
            .where(
                EventRow.kind == "job",
                EventRow.object_id == job_id,
                EventRow.type == "JobTransition",
            )
            .order_by(EventRow.id)
        )
        with self._session() as s:
            return attempts_of(EventRecord.of(r) for r in s.scalars(q))

    def event_horizon(self) -> int | None:
        """The greatest event id at or below which every event is committed (or never will
        be): a reader that moves a cursor over event ids reads no further, so it skips
        nothing. None means no limit: SQLite has one writer at a time, so its ids commit in
        order. PostgreSQL hands ids out before commit: a SHARE lock on `events` waits for
        the transactions that insert events, then the largest id is final (the lock ends
        with this short transaction). Call it outside any transaction that writes events."""
        if self.engine.dialect.name == "sqlite":
            return None
        with self.engine.begin() as conn:
            conn.execute(text("LOCK TABLE events IN SHARE MODE"))
            return conn.scalar(select(func.max(EventRow.id))) or 0

    def page_events(
        self,
        team: str | None = None,
        object_id: str | None = None,
        after: int = 0,
        limit: int = DEFAULT_LIMIT,
        cursor: str | None = None,
    ) -> tuple[list[EventRecord], str | None]:
        """A page of events oldest first, after id `after` and after the `cursor` (the
        later of the two), and the next page's cursor (None: no more events yet)."""
        (last,) = decode(cursor, "events", int) or (0,)
        rows = self.list_events(team, object_id, max(after, last), check_limit(limit) + 1)
        return page_of(rows, limit, "events", lambda e: (e.id,))

    def list_events(
        self,
        team: str | None = None,
        object_id: str | None = None,
        after: int = 0,
        limit: int = 500,
    ) -> list[EventRecord]:
        """Events after id `after`, oldest first; never past the event horizon, so a
        follower that passes its last id back as `after` misses none."""
        q = select(EventRow).where(EventRow.id > after).order_by(EventRow.id).limit(limit)
        horizon = self.event_horizon()
        if horizon is not None:
            q = q.where(EventRow.id <= horizon)
        if team is not None:
            q = q.where(EventRow.team == team)
        if object_id is not None:
            q = q.where(EventRow.object_id == object_id)
        with self._session() as s:
            return [EventRecord.of(r) for r in s.scalars(q)]
