"""Team budgets and caps in the state store (tables: store.budget_schema).

Invariants: a budget exists only for an existing team and always has a monthly amount;
`set` changes only the fields it is given (a new budget gets DEFAULTS for the others);
`mark` moves a crossing's month forward by compare-and-set and writes its Event in the
same transaction, so each crossing is recorded once per month however many control
planes, restarts or kill -9s try it; `record_spending` keeps the leader's last figure of
what each team spent this month (readers on every replica see the same).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, or_, select, update

from aicluster.core.lifecycle import JobStatus
from aicluster.store.budget_schema import TeamBudgetRow
from aicluster.store.db import Store
from aicluster.store.errors import NotFound
from aicluster.store.jobs import fields_of
from aicluster.store.schema import JobRow, TeamRow

FIELDS = ("monthly_micros", "warn_at", "enforce", "max_gpus", "max_queued_jobs")
DEFAULTS = {"warn_at": 0.8, "enforce": False, "max_gpus": None, "max_queued_jobs": None}
# a crossing -> (the column that keeps its month, the type of its Event)
CROSSINGS = {
    "warned": (TeamBudgetRow.last_warned_month, "BudgetWarning"),
    "over": (TeamBudgetRow.last_over_month, "BudgetExceeded"),
}


@dataclass(frozen=True)
class Budget:
    team: str
    monthly_micros: int  # micro-USD a month
    warn_at: float  # the fraction of it that warns
    enforce: bool  # over it, the team's new work waits
    max_gpus: int | None  # GPUs held at once, all pools together; None: no cap
    max_queued_jobs: int | None  # pending jobs at once; None: no cap
    last_warned_month: str | None  # YYYY-MM of the last warning crossing
    last_over_month: str | None  # YYYY-MM of the last crossing of the whole budget
    updated_at: float
    updated_by: str | None
    spent_month: str | None = None  # the month of `spent_micros`
    spent_micros: int | None = None  # spent in it, as the leader last computed it
    spent_at: float | None = None  # when

    def spent_in(self, month: str) -> int:
        """micro-USD spent in `month` as last computed (0 when not computed in it)."""
        return (self.spent_micros or 0) if self.spent_month == month else 0

    @classmethod
    def of(cls, row: TeamBudgetRow) -> Budget:
        return cls(**fields_of(cls, row))


class BudgetStore:
    """Shares the engine, session factory and clock of a `Store`."""

    def __init__(self, store: Store):
        self.store = store
        self._session = store._session
        self.clock = store.clock

    def set(self, team: str, changes: dict, actor: str | None = None) -> Budget | None:
        """Create or change `team`'s budget: the FIELDS in `changes`, the others as they
        were (DEFAULTS for a new one). None when the team has no budget and `changes`
        gives no monthly_micros; NotFound when there is no such team."""
        with self._session.begin() as s:
            if s.get(TeamRow, team) is None:
                raise NotFound(f"team {team!r} does not exist")
            row = s.get(TeamBudgetRow, team)
            if row is None:
                if changes.get("monthly_micros") is None:
                    return None
                row = TeamBudgetRow(team=team, **DEFAULTS)
                s.add(row)
            for name in FIELDS:
                if name in changes:
                    setattr(row, name, changes[name])
            row.updated_at, row.updated_by = self.clock(), actor
            s.flush()
            budget = Budget.of(row)
            self.store._event(
                s, "team", team, team, "BudgetSet", message=describe(budget), actor=actor
            )
            return budget

    def delete(self, team: str, actor: str | None = None) -> bool:
        """Remove the team's budget and caps; False when it had none."""
        with self._session.begin() as s:
            row = s.get(TeamBudgetRow, team)
            if row is None:
                return False
            s.delete(row)
            self.store._event(s, "team", team, team, "BudgetDeleted", actor=actor)
            return True

    def get(self, team: str) -> Budget | None:
        with self._session() as s:
            row = s.get(TeamBudgetRow, team)
            return Budget.of(row) if row is not None else None

    def all(self) -> list[Budget]:
        with self._session() as s:
            q = select(TeamBudgetRow).order_by(TeamBudgetRow.team)
            return [Budget.of(r) for r in s.scalars(q)]

    def mark(self, team: str, month: str, crossing: str, message: str) -> bool:
        """Record that `team` crossed its warning threshold (`warned`) or its budget
        (`over`) in `month` (YYYY-MM), with its Event: True the first time in that month,
        False every later time (and for a team without a budget)."""
        column, type_ = CROSSINGS[crossing]
        with self._session.begin() as s:
            done = s.execute(
                update(TeamBudgetRow)
                .where(TeamBudgetRow.team == team, or_(column.is_(None), column < month))
                .values({column.key: month})
            )
            if done.rowcount != 1:
                return False
            self.store._event(s, "team", team, team, type_, reason=crossing, message=message)
            return True

    def record_spending(self, month: str, spent: dict[str, int]) -> None:
        """What each team spent in `month` (micro-USD), now; one transaction, only the
        budgets whose figure changed."""
        with self._session.begin() as s:
            for row in s.scalars(select(TeamBudgetRow).where(TeamBudgetRow.team.in_(spent))):
                value = spent[row.team]
                if (row.spent_month, row.spent_micros) != (month, value):
                    row.spent_month, row.spent_micros = month, value
                    row.spent_at = self.clock()

    def pending_jobs(self, team: str) -> int:
        """How many jobs of `team` are PENDING (one count on the jobs' indexes)."""
        q = select(func.count()).where(
            JobRow.team == team, JobRow.status == JobStatus.PENDING.value
        )
        with self._session() as s:
            return s.scalar(q) or 0


def usd(micros: int) -> str:
    """`$1,234.50`; under a dollar, with the digits that show it (`$0.40`, `$0.0021`)."""
    value = micros / 1e6
    if value == 0 or abs(value) >= 1:
        return f"${value:,.2f}"
    whole, _, cents = f"{value:.6f}".rstrip("0").partition(".")
    return f"${whole}.{cents.ljust(2, '0')}"


def describe(b: Budget) -> str:
    """One line for a budget's Event: its amount, threshold, enforcement and caps."""
    caps = ", ".join(
        f"{name} {'none' if value is None else value}"
        for name, value in (("max_gpus", b.max_gpus), ("max_queued_jobs", b.max_queued_jobs))
    )
    enforced = "enforced" if b.enforce else "not enforced"
    return f"{usd(b.monthly_micros)} a month, warn at {b.warn_at:.0%}, {enforced}; {caps}"
