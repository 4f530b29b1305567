"""Rate limits in the state store (store.rate_limits_schema): per team and per API token.

Vocabulary: a *limit* has a scope (`team` or `token`), a subject (the team's name, the
token's id as text) and up to three figures: requests per second with a burst (the most
requests at once after a quiet spell) and tokens (prompt + completion) per minute; a
figure left None is no limit. Setting every figure None removes the limit.

Invariant: the gateways read the whole table (`all`) about once a second, never per
request (gateway.ratelimit).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import delete, select

from aicluster.store.db import Store
from aicluster.store.jobs import fields_of
from aicluster.store.rate_limits_schema import RateLimitRow

SCOPES = ("team", "token")


@dataclass(frozen=True)
class RateLimit:
    scope: str
    subject: str
    requests_per_s: float | None
    burst: int | None
    tokens_per_min: int | None
    updated_at: float
    actor: str | None

    @classmethod
    def of(cls, row: RateLimitRow) -> RateLimit:
        return cls(**fields_of(cls, row))


class RateLimitStore:
    """Shares the engine, session factory and clock of a `Store`."""

    def __init__(self, store: Store):
        self.store = store
        self._session = store._session
        self.clock = store.clock

    def set(
        self,
        scope: str,
        subject: str,
        requests_per_s: float | None,
        burst: int | None,
        tokens_per_min: int | None,
        actor: str | None = None,
    ) -> RateLimit | None:
        """Set (replace) the limit of a team or token; all figures None: remove it (None)."""
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {SCOPES}")
        figures = (requests_per_s, burst, tokens_per_min)
        with self._session.begin() as s:
            row = s.get(RateLimitRow, (scope, subject))
            if all(f is None for f in figures):
                if row is not None:
                    s.execute(
                        delete(RateLimitRow).where(
                            RateLimitRow.scope == scope, RateLimitRow.subject == subject
                        )
                    )
                message = f"{scope} {subject}: no limit"
                self.store._event(
                    s,
                    "rate_limit",
                    f"{scope}:{subject}",
                    None,
                    "RateLimitSet",
                    message=message,
                    actor=actor,
                )
                return None
            if row is None:
                row = RateLimitRow(scope=scope, subject=subject)
            row.requests_per_s, row.burst, row.tokens_per_min = figures
            row.updated_at, row.actor = self.clock(), actor
            s.add(row)
            s.flush()
            message = (
                f"{scope} {subject}: {requests_per_s} requests/s (burst {burst}), "
                f"{tokens_per_min} tokens/min"
            )
            team = subject if scope == "team" else None
            self.store._event(
                s,
                "rate_limit",
                f"{scope}:{subject}",
                team,
                "RateLimitSet",
                message=message,
                actor=actor,
            )
            return RateLimit.of(row)

    def all(self) -> list[RateLimit]:
        q = select(RateLimitRow).order_by(RateLimitRow.scope, RateLimitRow.subject)
        with self._session() as s:
            return [RateLimit.of(r) for r in s.scalars(q)]
