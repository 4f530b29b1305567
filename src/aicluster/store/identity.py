"""Identity in the state store: teams, users, API tokens and who a token is (Principal).

Invariants: a token's plaintext is returned once and only its SHA-256 digest is stored;
a job's token is scoped (a member of the job's team, its own checkpoints only), one live
token per job attempt, dead when the attempt ends or expires; each team has one workload
uid, allocated once and never reused.

Token lifecycle: a user's token may have an expiry; revoking one is for good (the row
stays, `revoked_at` says when); `last_used_at` is written at most once a minute per
token (LAST_USED_EVERY_S), never on every request. A refused token says why (`Refusal`):
expired or revoked; an unknown one says nothing.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field

from sqlalchemy import func, or_, select, update
from sqlalchemy.exc import IntegrityError, OperationalError

from aicluster.store.cursors import DEFAULT_LIMIT, check_limit, decode, page_of
from aicluster.store.errors import Conflict, NotFound
from aicluster.store.schema import JobRow, TeamRow, TokenRow, UserRow

TOKEN_PREFIX = "aic_"
WORKLOAD_UID_BASE = 50000  # team workload users: 50000, 50001, ...
JOB_TOKEN_TTL_S = 7 * 24 * 3600.0  # a hard cap; a job's token also dies with its attempt
LAST_USED_EVERY_S = 60.0  # a token's last use is written at most this often


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
    token_id: int | None = field(default=None, compare=False)  # the token it called with

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def may_write_artifact(self, team: str, name: str) -> bool:
        if self.job_id is None:
            return True
        return team == self.team and name == f"{self.job_name}-ckpt"


@dataclass(frozen=True)
class TokenInfo:
    """A token as its owner and admins see it: never its secret (`prefix` is its first
    10 characters, to tell tokens apart)."""

    id: int
    user: str
    prefix: str
    created_at: float
    expires_at: float | None
    last_used_at: float | None
    revoked_at: float | None
    revoked: bool

    @classmethod
    def of(cls, row: TokenRow) -> TokenInfo:
        return cls(**{f: getattr(row, f) for f in cls.__dataclass_fields__})

    def state(self, now: float) -> str:
        """active | expired | revoked"""
        if self.revoked:
            return "revoked"
        return "expired" if self.expires_at is not None and self.expires_at <= now else "active"


@dataclass(frozen=True)
class Refusal:
    """Why a known token was refused: `expired` (at `at`) or `revoked` (at `at`, None
    when not recorded, as for a job's token whose attempt ended)."""

    why: str
    at: float | None


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

    def create_token(self, user: str, expires_at: float | None = None) -> str:
        """Return a new plaintext token of `user`; only its SHA-256 digest is stored.
        (A job's token is made by `create_job_token`.)"""
        return self.issue_token(user, expires_at)[0]

    def issue_token(self, user: str, expires_at: float | None = None) -> tuple[str, TokenInfo]:
        """A new token of `user` (expiring at `expires_at`, None: never): its plaintext,
        returned this once, and what is kept of it."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self._session.begin() as s:
            if s.get(UserRow, user) is None:
                raise NotFound(f"user {user!r} does not exist")
            row = TokenRow(
                user=user,
                digest=digest(token),
                prefix=token[:10],
                created_at=self.clock(),
                expires_at=expires_at,
                revoked=False,
            )
            s.add(row)
            s.flush()
            return token, TokenInfo.of(row)

    def list_tokens(self, user: str | None) -> list[TokenInfo]:
        """The user tokens of `user` (None: of everyone), oldest first; not jobs' tokens."""
        q = select(TokenRow).where(TokenRow.scope == "user").order_by(TokenRow.id)
        if user is not None:
            q = q.where(TokenRow.user == user)
        with self._session() as s:
            return [TokenInfo.of(r) for r in s.scalars(q)]

    def page_tokens(
        self, user: str | None, limit: int = DEFAULT_LIMIT, cursor: str | None = None
    ) -> tuple[list[TokenInfo], str | None]:
        """A page of `list_tokens`, oldest first, and the next page's cursor: a keyset read
        on id (ix_tokens_user_id); BadCursor for a bad cursor."""
        (last,) = decode(cursor, "tokens", int) or (0,)
        q = select(TokenRow).where(TokenRow.scope == "user", TokenRow.id > last)
        if user is not None:
            q = q.where(TokenRow.user == user)
        with self._session() as s:
            rows = s.scalars(q.order_by(TokenRow.id).limit(check_limit(limit) + 1))
            return page_of([TokenInfo.of(r) for r in rows], limit, "tokens", lambda t: (t.id,))

    def get_token(self, token_id: int) -> TokenInfo | None:
        """A user token by id (None for a job's token or none)."""
        with self._session() as s:
            row = s.get(TokenRow, token_id)
            return TokenInfo.of(row) if row is not None and row.scope == "user" else None

    def revoke_token(self, token_id: int, actor: str | None = None) -> TokenInfo:
        """Revoke a user token for good (again: no change); NotFound for none."""
        with self._session.begin() as s:
            row = s.get(TokenRow, token_id)
            if row is None or row.scope != "user":
                raise NotFound(f"token {token_id} not found")
            if not row.revoked:
                row.revoked, row.revoked_at = True, self.clock()
                message = f"token {row.id} ({row.prefix}...) of user {row.user} revoked"
                self._event(
                    s, "token", str(row.id), None, "TokenRevoked", message=message, actor=actor
                )
            return TokenInfo.of(row)

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
        who = self.identify(token)
        return who if isinstance(who, Principal) else None

    def identify(self, token: str) -> Principal | Refusal | None:
        """Who `token` is; a Refusal for a known token that no longer works (expired,
        revoked); None for anything else. Notes the token's use (at most once a minute)."""
        if not isinstance(token, str) or len(token) > 256:
            return None
        now = self.clock()
        with self._session() as s:
            row = s.scalars(select(TokenRow).where(TokenRow.digest == digest(token))).first()
            if row is None:
                return None
            if row.revoked:
                return Refusal("revoked", row.revoked_at)
            if row.expires_at is not None and row.expires_at <= now:
                return Refusal("expired", row.expires_at)
            who = self._principal(s, row)
            if who is None:
                return Refusal("revoked", None)  # a job's token whose attempt is over
            token_id, last = row.id, row.last_used_at
        if last is None or now - last >= LAST_USED_EVERY_S:
            self._note_use(token_id, now)
        return who

    def _principal(self, s, row: TokenRow) -> Principal | None:
        user = s.get(UserRow, row.user)
        if row.scope != "job":
            return Principal(user.name, user.team, user.role, token_id=row.id)
        job = s.scalars(select(JobRow).where(JobRow.id == row.job_id)).first()
        if job is None or job.status not in ("ADMITTED", "RUNNING") or job.attempt != row.attempt:
            return None
        role = "viewer" if user.role == "viewer" else "member"
        return Principal(user.name, job.team, role, job_id=job.id, job_name=job.name)

    def _note_use(self, token_id: int, now: float) -> None:
        """last_used_at = now unless another request wrote it in the last minute; a busy
        database skips it (the next request a minute on writes it)."""
        stale = or_(
            TokenRow.last_used_at.is_(None), TokenRow.last_used_at <= now - LAST_USED_EVERY_S
        )
        try:
            with self._session.begin() as s:
                s.execute(
                    update(TokenRow).where(TokenRow.id == token_id, stale).values(last_used_at=now)
                )
        except OperationalError:
            pass  # best effort: a locked SQLite file must not fail the request

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
