"""The state store. Return values are plain records, never live ORM objects."""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import create_engine, event, func, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from aicluster.core.lifecycle import JobStatus, Reason, check_transition
from aicluster.store.schema import EventRow, JobRow, TeamRow, TokenRow, UserRow

TOKEN_PREFIX = "aic_"


class Conflict(Exception):
    """A name that must be unique is taken."""


class NotFound(Exception):
    pass


@dataclass(frozen=True)
class Principal:
    """Who calls. A *job principal* (`job_id` set) is a job's scoped token: it acts
    as a member of the job's team (never as admin, whoever owns the job), may read
    that team's artifacts and write only its own checkpoints (`JOBNAME-ckpt`)."""

    user: str
    team: str | None
    role: str  # admin | member | viewer
    job_id: str | None = None
    job_name: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def may_write_artifact(self, team: str, name: str) -> bool:
        if self.job_id is None:
            return True
        return team == self.team and name == f"{self.job_name}-ckpt"


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
    spec: dict
    status: JobStatus
    reason: str | None
    message: str | None
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

    @classmethod
    def of(cls, row: JobRow) -> JobRecord:
        return cls(**{**fields_of(cls, row), "status": JobStatus(row.status)})


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

    @classmethod
    def of(cls, row: EventRow) -> EventRecord:
        return cls(**fields_of(cls, row))


WORKLOAD_UID_BASE = 50000  # team workload users: 50000, 50001, ...
JOB_TOKEN_TTL_S = 7 * 24 * 3600.0  # a hard cap; a job's token also dies with its attempt


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.close()


def open_store(url_or_path: str | Path, clock=time.time) -> Store:
    url = str(url_or_path)
    if "://" not in url:
        url = f"sqlite:///{Path(url).resolve()}"
    engine = create_engine(url, future=True)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    migrate(engine)
    return Store(engine, clock)


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest Alembic revision (idempotent, one transaction)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "heads")  # independent branches (one per feature) all apply


class Store:
    def __init__(self, engine: Engine, clock=time.time):
        self.engine = engine
        self.clock = clock
        self._session = sessionmaker(engine, expire_on_commit=False)

    def close(self) -> None:
        self.engine.dispose()

    # -- teams, users, tokens -------------------------------------------------

    def create_team(self, name: str, actor: str | None = None) -> None:
        with self._session.begin() as s:
            if s.get(TeamRow, name) is not None:
                raise Conflict(f"team {name!r} already exists")
            s.add(TeamRow(name=name, created_at=self.clock()))
            self._event(s, "team", name, name, "TeamCreated", actor=actor)

    def ensure_team(self, name: str) -> None:
        try:
            self.create_team(name)
        except (Conflict, IntegrityError):
            pass

    def list_teams(self) -> list[str]:
        with self._session() as s:
            return list(s.scalars(select(TeamRow.name).order_by(TeamRow.name)))

    def team_exists(self, name: str) -> bool:
        with self._session() as s:
            return s.get(TeamRow, name) is not None

    def create_user(self, name: str, team: str | None, role: str) -> None:
        with self._session.begin() as s:
            if s.get(UserRow, name) is not None:
                raise Conflict(f"user {name!r} already exists")
            if team is not None and s.get(TeamRow, team) is None:
                raise NotFound(f"team {team!r} does not exist")
            s.add(UserRow(name=name, team=team, role=role, created_at=self.clock()))

    def get_user(self, name: str) -> Principal | None:
        with self._session() as s:
            row = s.get(UserRow, name)
            return Principal(row.name, row.team, row.role) if row else None

    def create_token(self, user: str, job_id: str | None = None) -> str:
        """Return a new plaintext token; only its SHA-256 digest is stored. A token made
        for a job (`job_id`) acts as the job's owner and is revoked when the job ends."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self._session.begin() as s:
            if s.get(UserRow, user) is None:
                raise NotFound(f"user {user!r} does not exist")
            s.add(
                TokenRow(
                    user=user,
                    digest=digest(token),
                    prefix=token[:10],
                    created_at=self.clock(),
                    job_id=job_id,
                )
            )
        return token

    def create_job_token(self, job_id: str, attempt: int, ttl_s: float = JOB_TOKEN_TTL_S) -> str:
        """The one live token of a job attempt: every earlier token of the job is revoked;
        it expires after `ttl_s` and stops working as soon as the attempt is not the
        job's current, active one."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        now = self.clock()
        with self._session.begin() as s:
            job = s.scalars(select(JobRow).where(JobRow.id == job_id)).first()
            if job is None:
                raise NotFound(f"job {job_id!r} does not exist")
            s.execute(
                update(TokenRow)
                .where(TokenRow.job_id == job_id, TokenRow.revoked.is_(False))
                .values(revoked=True)
            )
            s.add(
                TokenRow(
                    user=job.owner,
                    digest=digest(token),
                    prefix=token[:10],
                    created_at=now,
                    job_id=job_id,
                    scope="job",
                    expires_at=now + ttl_s,
                    attempt=attempt,
                )
            )
        return token

    def authenticate(self, token: str) -> Principal | None:
        if not isinstance(token, str) or len(token) > 256:
            return None
        with self._session() as s:
            row = s.scalars(
                select(TokenRow).where(
                    TokenRow.digest == digest(token), TokenRow.revoked.is_(False)
                )
            ).first()
            if row is None or (row.expires_at is not None and row.expires_at <= self.clock()):
                return None
            user = s.get(UserRow, row.user)
            if row.scope != "job":
                return Principal(user.name, user.team, user.role)
            job = s.scalars(select(JobRow).where(JobRow.id == row.job_id)).first()
            if (
                job is None
                or job.status not in ("ADMITTED", "RUNNING")
                or job.attempt != row.attempt
            ):
                return None
            role = "viewer" if user.role == "viewer" else "member"
            return Principal(user.name, job.team, role, job_id=job.id, job_name=job.name)

    def revoke_tokens_of_finished_jobs(self) -> int:
        """Level-triggered: every token of a job in a terminal status stops working."""
        done = select(JobRow.id).where(JobRow.status.in_(["SUCCEEDED", "FAILED", "CANCELLED"]))
        with self._session.begin() as s:
            res = s.execute(
                update(TokenRow)
                .where(TokenRow.job_id.in_(done), TokenRow.revoked.is_(False))
                .values(revoked=True)
            )
            return res.rowcount

    def revoke_job_tokens(self, job_id: str) -> int:
        with self._session.begin() as s:
            res = s.execute(
                update(TokenRow)
                .where(TokenRow.job_id == job_id, TokenRow.revoked.is_(False))
                .values(revoked=True)
            )
            return res.rowcount

    def team_uid(self, team: str, base: int = WORKLOAD_UID_BASE) -> int:
        """The Unix uid (and gid) the team's workloads run as; allocated once, never reused."""
        for _ in range(5):
            try:
                with self._session.begin() as s:
                    row = s.get(TeamRow, team)
                    if row is None:
                        raise NotFound(f"team {team!r} does not exist")
                    if row.uid is not None:
                        return row.uid
                    top = s.scalar(select(func.max(TeamRow.uid)))
                    row.uid = max(base, (top or 0) + 1)
                    return row.uid
            except IntegrityError:
                continue  # another writer took that uid: take the next
        raise Conflict(f"could not allocate a workload uid for team {team!r}")

    def has_admin(self) -> bool:
        with self._session() as s:
            return s.scalars(select(UserRow).where(UserRow.role == "admin")).first() is not None

    # -- jobs -------------------------------------------------------------------

    def create_job(self, spec: dict, owner: str, workdir: str | None = None) -> JobRecord:
        for _ in range(5):  # the id's random suffix may, rarely, be taken
            try:
                return self._create_job(spec, owner, workdir)
            except IntegrityError:
                continue
        raise Conflict(f"could not allocate an id for job {spec['name']!r}")

    def _create_job(self, spec: dict, owner: str, workdir: str | None) -> JobRecord:
        now = self.clock()
        with self._session.begin() as s:
            if s.get(TeamRow, spec["team"]) is None:
                raise NotFound(f"team {spec['team']!r} does not exist")
            row = JobRow(
                id=f"{spec['name']}-{secrets.token_hex(3)}",
                name=spec["name"],
                team=spec["team"],
                owner=owner,
                spec=spec,
                status=JobStatus.PENDING.value,
                reason=Reason.SUBMITTED.value,
                priority=spec.get("priority", 0),
                restarts=0,
                attempt=0,
                workdir=workdir,
                created_at=now,
                updated_at=now,
            )
            s.add(row)
            s.flush()
            self._event(
                s,
                "job",
                row.id,
                row.team,
                "JobSubmitted",
                None,
                "PENDING",
                Reason.SUBMITTED,
                f"{spec['workers']} worker(s)",
                owner,
            )
            return JobRecord.of(row)

    def get_job(self, job_id: str) -> JobRecord | None:
        with self._session() as s:
            row = s.scalars(select(JobRow).where(JobRow.id == job_id)).first()
            return JobRecord.of(row) if row else None

    def newest_jobs_named(self, name: str, team: str | None = None) -> list[JobRecord]:
        """The newest job called `name` in each team that has one (in `team` alone when
        given), newest first. One query on the (name, team) index: `seq` orders submissions,
        so the greatest `seq` per team is its newest job of that name."""
        newest = select(func.max(JobRow.seq)).where(JobRow.name == name)
        if team is not None:
            newest = newest.where(JobRow.team == team)
        q = select(JobRow).where(JobRow.seq.in_(newest.group_by(JobRow.team)))
        with self._session() as s:
            return [JobRecord.of(r) for r in s.scalars(q.order_by(JobRow.seq.desc()))]

    def list_jobs(
        self,
        team: str | None = None,
        statuses: Iterable[JobStatus] | None = None,
        limit: int = 1000,
    ) -> list[JobRecord]:
        q = select(JobRow).order_by(JobRow.seq.desc()).limit(limit)
        if team is not None:
            q = q.where(JobRow.team == team)
        if statuses is not None:
            q = q.where(JobRow.status.in_([st.value for st in statuses]))
        with self._session() as s:
            return [JobRecord.of(r) for r in s.scalars(q)]

    def transition(
        self,
        job_id: str,
        src: JobStatus,
        dst: JobStatus,
        reason: Reason,
        message: str | None = None,
        actor: str | None = None,
        **fields,
    ) -> JobRecord | None:
        """Compare-and-set the status; write the Event in the same transaction.

        Returns the new record, or None when the job was no longer in `src`.
        """
        check_transition(src, dst)
        now = self.clock()
        values = dict(status=dst.value, reason=reason.value, message=message, updated_at=now)
        if dst == JobStatus.RUNNING:
            values["started_at"] = now
        if dst.terminal:
            values["finished_at"] = now
        values.update(fields)
        with self._session.begin() as s:
            res = s.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.status == src.value)
                .values(**values)
            )
            if res.rowcount != 1:
                return None
            row = s.scalars(select(JobRow).where(JobRow.id == job_id)).first()
            self._event(
                s,
                "job",
                job_id,
                row.team,
                "JobTransition",
                src.value,
                dst.value,
                reason,
                message,
                actor,
            )
            return JobRecord.of(row)

    def set_wait_message(self, job_id: str, message: str) -> bool:
        """Record why a PENDING job waits; an Event only when the reason changes."""
        with self._session.begin() as s:
            row = s.scalars(select(JobRow).where(JobRow.id == job_id)).first()
            if row is None or row.status != JobStatus.PENDING.value or row.message == message:
                return False
            row.message = message
            row.updated_at = self.clock()
            self._event(s, "job", job_id, row.team, "JobWaiting", message=message)
            return True

    # -- events -----------------------------------------------------------------

    def add_event(self, kind: str, object_id: str, team: str | None, type_: str, **kw) -> None:
        with self._session.begin() as s:
            self._event(s, kind, object_id, team, type_, **kw)

    def _event(
        self,
        s: Session,
        kind,
        object_id,
        team,
        type_,
        from_status=None,
        to_status=None,
        reason=None,
        message=None,
        actor=None,
    ) -> None:
        s.add(
            EventRow(
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
            )
        )

    def list_events(
        self,
        team: str | None = None,
        object_id: str | None = None,
        after: int = 0,
        limit: int = 500,
    ) -> list[EventRecord]:
        q = select(EventRow).where(EventRow.id > after).order_by(EventRow.id).limit(limit)
        if team is not None:
            q = q.where(EventRow.team == team)
        if object_id is not None:
            q = q.where(EventRow.object_id == object_id)
        with self._session() as s:
            return [EventRecord.of(r) for r in s.scalars(q)]
