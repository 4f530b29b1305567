"""The rate limits admins set (store.rate_limits): per team and per API token, requests
per second with a burst, and tokens per minute; a limit left None is no limit."""

from __future__ import annotations

from sqlalchemy import BigInteger, Float, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from aicluster.store.schema import Base


class RateLimitRow(Base):
    __tablename__ = "rate_limits"
    scope: Mapped[str] = mapped_column(String(8), primary_key=True)  # team | token
    subject: Mapped[str] = mapped_column(String(64), primary_key=True)  # a team, a token id
    requests_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    burst: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tokens_per_min: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    updated_at: Mapped[float] = mapped_column(Float)
    actor: Mapped[str | None] = mapped_column(String(64), nullable=True)
