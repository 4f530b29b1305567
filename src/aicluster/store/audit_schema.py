"""The audit log's table: one row per audited API call (store.audit).

A row says who called (user, role, team; the job for a job's scoped token), what (the
HTTP method, the route's template, the target: the objects the call named), the outcome
(the HTTP status) and from where (the client's address), at what time (UNIX seconds).
It never holds a token, a secret or a request body.
"""

from __future__ import annotations

from sqlalchemy import Float, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from aicluster.store.schema import Base


class AuditRow(Base):
    __tablename__ = "audit_log"
    __table_args__ = (Index("ix_audit_log_user_id", "user", "id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ts: Mapped[float] = mapped_column(Float, index=True)
    user: Mapped[str | None] = mapped_column(String(64), nullable=True)  # None: no valid token
    role: Mapped[str | None] = mapped_column(String(16), nullable=True)
    team: Mapped[str | None] = mapped_column(String(64), nullable=True)
    job_id: Mapped[str | None] = mapped_column(String(80), nullable=True)  # a job's token
    method: Mapped[str] = mapped_column(String(8))
    route: Mapped[str] = mapped_column(String(256))  # the template: /v1/jobs/{job_id}/cancel
    target: Mapped[str | None] = mapped_column(String(512), nullable=True)
    status: Mapped[int] = mapped_column(Integer)
    source: Mapped[str | None] = mapped_column(String(64), nullable=True)  # client address
