"""Team quotas per pool (Kueue's nominal quota, borrowing and lending limits)."""

from __future__ import annotations

from sqlalchemy import Float, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from aicluster.store.schema import Base


class QuotaRow(Base):
    __tablename__ = "quotas"
    team: Mapped[str] = mapped_column(ForeignKey("teams.name"), primary_key=True)
    pool: Mapped[str] = mapped_column(String(64), primary_key=True)
    gpus: Mapped[int] = mapped_column(Integer)
    borrow_gpus: Mapped[int | None] = mapped_column(Integer, nullable=True)
    lend_gpus: Mapped[int | None] = mapped_column(Integer, nullable=True)
    cpus: Mapped[float | None] = mapped_column(Float, nullable=True)
    memory: Mapped[int | None] = mapped_column(Integer, nullable=True)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    cohort: Mapped[str] = mapped_column(String(64), default="default")
