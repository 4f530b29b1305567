"""Identity in the state store: teams, users, API tokens and who a token is (Principal).

Invariants: a token's plaintext is returned once and only its SHA-256 digest is stored;
a job's token is scoped (a member of the job's team, its own checkpoints only), one live
token per job attempt, dead when the attempt ends or expires; each team has one workload
uid, allocated once and never reused.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError

from aicluster.store.errors import Conflict, NotFound
from aicluster.store.schema import JobRow, TeamRow, TokenRow, UserRow

TOKEN_PREFIX = "aic_"
WORKLOAD_UID_BASE = 50000  # team workload users: 50000, 50001, ...
JOB_TOKEN_TTL_S = 7 * 24 * 3600.0  # a hard cap; a job's token also dies with its attempt


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


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


class IdentityStore:
    """Teams, users and tokens; mixed into store.db.Store (its session, clock and events)."""

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

    def create_token(self, user: str) -> str:
        """Return a new plaintext token of `user`; only its SHA-256 digest is stored.
        (A job's token is made by `create_job_token`.)"""
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
