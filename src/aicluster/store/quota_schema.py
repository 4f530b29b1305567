"""Team quotas per pool (Kueue's nominal quota, borrowing and lending limits)."""

from __future__ import annotations

from sqlalchemy import BigInteger, Float, ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from aicluster.store.schema import Base


class QuotaRow(Base):
    __tablename__ = "quotas"
    team: Mapped[str] = mapped_column(ForeignKey("teams.name"), primary_key=True)
    pool: Mapped[str] = mapped_column(String(64), primary_key=True)
    # 64-bit: the API accepts figures up to 2**63-1 (PostgreSQL's INTEGER is 32-bit)
    gpus: Mapped[int] = mapped_column(BigInteger)
    borrow_gpus: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    lend_gpus: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    cpus: Mapped[float | None] = mapped_column(Float, nullable=True)
    memory: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # bytes
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    cohort: Mapped[str] = mapped_column(String(64), default="default")
