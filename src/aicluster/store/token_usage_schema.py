"""Tables of the gateway's token usage: sums per (UTC minute, caller's team, service,
token), and the batches already taken (store.token_usage).

Quantities are integers, so every total is the exact sum of what the gateways reported:
requests, errors, prompt and completion tokens, cost in micro-units of the price's
currency, and the requests a rate limit refused (`limited`, counted in requests and
errors too; their service is '' when the limit refused them before the body named one). The caller's team is '' for an admin without one (NULLs would defeat the key).
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Float, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from aicluster.store.schema import Base

TOKEN_SUMS = ("requests", "errors", "prompt_tokens", "completion_tokens", "cost_micros", "limited")


class TokenUsageRow(Base):
    __tablename__ = "token_usage"
    __table_args__ = (
        UniqueConstraint(
            "minute", "team", "service", "token_id", "user", "model", name="uq_token_usage_key"
        ),
        Index("ix_token_usage_team_minute", "team", "minute"),
        Index("ix_token_usage_minute", "minute"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    minute: Mapped[int] = mapped_column(BigInteger)  # UNIX minutes: floor(t / 60)
    team: Mapped[str] = mapped_column(String(64))  # the caller's; '' for none
    user: Mapped[str] = mapped_column(String(64))
    token_id: Mapped[int] = mapped_column(Integer)
    service: Mapped[str] = mapped_column(String(128))  # TEAM/NAME of the service
    model: Mapped[str] = mapped_column(String(256))  # the model the engine served
    requests: Mapped[int] = mapped_column(BigInteger)
    errors: Mapped[int] = mapped_column(BigInteger)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    completion_tokens: Mapped[int] = mapped_column(BigInteger)
    cost_micros: Mapped[int] = mapped_column(BigInteger)
    limited: Mapped[int] = mapped_column(BigInteger, default=0)  # of `requests`: refused (429)


class TokenUsageBatchRow(Base):
    """A batch of usage a gateway flushed, taken once: its id committed with its sums is
    the acknowledgement, and the same id again changes nothing."""

    __tablename__ = "token_usage_batches"
    batch_id: Mapped[str] = mapped_column(String(80), primary_key=True)
    source: Mapped[str] = mapped_column(String(80))  # the gateway that sent it
    rows: Mapped[int] = mapped_column(Integer)
    accepted_at: Mapped[float] = mapped_column(Float, index=True)
