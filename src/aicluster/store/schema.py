"""Tables. Times are UNIX seconds (float); JSON columns hold specs and placements."""

from __future__ import annotations

from sqlalchemy import JSON, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class TeamRow(Base):
    __tablename__ = "teams"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[float] = mapped_column(Float)
    uid: Mapped[int | None] = mapped_column(
        Integer, nullable=True, unique=True, index=True
    )  # workload user


class UserRow(Base):
    __tablename__ = "users"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    team: Mapped[str | None] = mapped_column(ForeignKey("teams.name"), nullable=True)
    role: Mapped[str] = mapped_column(String(16))  # admin | member | viewer
    created_at: Mapped[float] = mapped_column(Float)


class TokenRow(Base):
    __tablename__ = "tokens"
    __table_args__ = (Index("ix_tokens_user_id", "user", "id"),)  # pages of a user's (0027)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user: Mapped[str] = mapped_column(ForeignKey("users.name"))
    digest: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Float)
    revoked: Mapped[bool] = mapped_column(default=False)
    job_id: Mapped[str | None] = mapped_column(String(80), nullable=True, index=True)
    scope: Mapped[str] = mapped_column(String(16), default="user")  # user | job
    expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Lifecycle (store.identity): when it last authenticated (written at most once a
    # minute) and when it was revoked.
    last_used_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class JobRow(Base):
    __tablename__ = "jobs"
    # A job's name resolves to the newest job of that name (in a team): Store.newest_jobs_named.
    # Pages of a status's or a team's jobs, newest first, are keyset reads on seq (0027).
    __table_args__ = (
        Index("ix_jobs_name_team", "name", "team"),
        Index("ix_jobs_status_seq", "status", "seq"),
        Index("ix_jobs_team_seq", "team", "seq"),
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(80), unique=True, index=True)
    name: Mapped[str] = mapped_column(String(64))
    team: Mapped[str] = mapped_column(ForeignKey("teams.name"), index=True)
    owner: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    # core.lifecycle.RequeueCause of the latest requeue; None while never requeued
    requeue_cause: Mapped[str | None] = mapped_column(String(32), nullable=True)
    # core.model.WaitKind of why a PENDING job waits (with `message`); None once it leaves
    wait_kind: Mapped[str | None] = mapped_column(String(32), nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    placement: Mapped[list | None] = mapped_column(JSON, nullable=True)
    workdir: Mapped[str | None] = mapped_column(String(80), nullable=True)  # blob file name
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # when its own token last committed a checkpoint version (0033); any attempt's
    last_checkpoint_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class EventRow(Base):
    __tablename__ = "events"
    # Pages of a team's or an object's events are keyset reads on id (0027).
    __table_args__ = (
        Index("ix_events_team_id", "team", "id"),
        Index("ix_events_object_id_id", "object_id", "id"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ts: Mapped[float] = mapped_column(Float, index=True)
    kind: Mapped[str] = mapped_column(String(16))  # job | node | team | token
    object_id: Mapped[str] = mapped_column(String(96), index=True)  # a job id: name + 7
    team: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    type: Mapped[str] = mapped_column(String(32))
    from_status: Mapped[str | None] = mapped_column(String(16), nullable=True)
    to_status: Mapped[str | None] = mapped_column(String(16), nullable=True)
    reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    actor: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # A job transition's attempt (the job's attempt after it), on admission the node of each
    # rank, on a requeue its cause: the story of every attempt (store.jobs.attempts_of).
    attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)
    placement: Mapped[list | None] = mapped_column(JSON, nullable=True)
    requeue_cause: Mapped[str | None] = mapped_column(String(32), nullable=True)
    # An interrupted attempt's end: when it stopped making progress (the last time every
    # worker answered before its node died); recovery is measured from there.
    interrupted_at: Mapped[float | None] = mapped_column(Float, nullable=True)
