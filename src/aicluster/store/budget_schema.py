"""Team budgets and caps (store.budgets): one row per team that has one.

Money is in micro-USD (integers, as the usage ledger's `cost_micros`). A month is a UTC
calendar month written `YYYY-MM`; `last_warned_month` and `last_over_month` are the last
months in which the team's spending crossed its warning threshold and its whole budget,
each moved forward once per month by compare-and-set with the Event that says so.
`spent_micros` is what the team spent in `spent_month`, as the leader's budget step last
computed it (control.budgets), at `spent_at`.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Float, ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from aicluster.store.schema import Base


class TeamBudgetRow(Base):
    __tablename__ = "team_budgets"
    team: Mapped[str] = mapped_column(ForeignKey("teams.name"), primary_key=True)
    monthly_micros: Mapped[int] = mapped_column(BigInteger)
    warn_at: Mapped[float] = mapped_column(Float)  # a fraction of the monthly budget
    enforce: Mapped[bool] = mapped_column(Boolean)  # over budget: no new work starts
    # 64-bit: the API accepts figures up to 2**63-1 (PostgreSQL's INTEGER is 32-bit)
    max_gpus: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    max_queued_jobs: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    last_warned_month: Mapped[str | None] = mapped_column(String(7), nullable=True)
    last_over_month: Mapped[str | None] = mapped_column(String(7), nullable=True)
    spent_month: Mapped[str | None] = mapped_column(String(7), nullable=True)
    spent_micros: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    spent_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    updated_at: Mapped[float] = mapped_column(Float)
    updated_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
