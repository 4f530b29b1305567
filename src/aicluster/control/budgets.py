"""Team budgets and caps: what a team spends in a month against its budget, the Events
and metrics that say so, and the limits the scheduler applies.

Vocabulary: a team's *budget* (store.budgets) is a monthly amount in USD, a warning
threshold `warn_at` (a fraction of it) and whether it is *enforced*, with two caps:
`max_gpus` (GPUs its running workloads hold at once, in every pool together, whatever its
quotas and borrowing allow) and `max_queued_jobs` (its pending jobs; a submit past it is
refused, 429). A month is a UTC calendar month, `YYYY-MM`.

*Spent this month* (`BudgetOps.spending`) is the team's ledger cost for the current month,
the lines that ended in it (control.usage; read from the per-team daily sums), plus the
accrued cost of its job attempts RUNNING now: their run time so far at the rates their
lines will have (`Accountant.running_cost`). An attempt is charged, whole, to the month it
ends in, as the ledger does. The leader's step computes it and stores it with the budget;
the API, the metrics and the scheduler's limits read that figure, so all of them (on every
replica) agree. *State*: `over` from 100% of the budget, `warned` from `warn_at`, else `ok`.

Invariants: one Event per team, month and threshold (BudgetWarning, BudgetExceeded): the
month of a crossing is kept in the store and moved by compare-and-set in the Event's
transaction, so restarts and kill -9 repeat none. The leader's step (`BudgetStep`, every
`every_s`) brings the ledger up to date first, so an attempt that just ended is counted
once, in the ledger, not as running. The limits (core.model.TeamLimit) reach the scheduler
through the snapshot, made at each admission from the budgets as stored then and the
spending of the last step: over an enforced budget the team's new work waits (`budget`),
its running work continues; caps hold whatever the budget. A new term steps before its
first admission.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from prometheus_client.core import GaugeMetricFamily

from aicluster.control.api_ops import BadRequest, ForbiddenError, NotFoundError
from aicluster.control.oplog import decision as log_decision
from aicluster.core.lifecycle import JobStatus
from aicluster.core.model import TeamLimit
from aicluster.store.budgets import Budget, BudgetStore, usd
from aicluster.store.db import Store
from aicluster.store.identity import Principal
from aicluster.store.usage import UsageStore

decisions = logging.getLogger("aicluster.decisions")  # the operator's log (control.oplog)
MICROS = 1_000_000
MAX_RUNNING = 1_000_000  # running jobs read per computation (every one, in practice)


class QueueFull(Exception):
    """A submit past the team's max_queued_jobs (429); `field` names the cap."""

    field = "max_queued_jobs"


def month_of(now: float) -> tuple[str, float]:
    """The UTC calendar month of `now`: its name (YYYY-MM) and its first second."""
    t = datetime.fromtimestamp(now, UTC)
    start = datetime(t.year, t.month, 1, tzinfo=UTC)
    return f"{t.year:04d}-{t.month:02d}", start.timestamp()


@dataclass(frozen=True)
class BudgetStatus:
    """A team's budget and what it has spent this month (micro-USD)."""

    budget: Budget
    month: str
    spent_micros: int

    @property
    def used_ratio(self) -> float:
        return self.spent_micros / self.budget.monthly_micros

    @property
    def state(self) -> str:
        if self.spent_micros >= self.budget.monthly_micros:
            return "over"
        return "warned" if self.used_ratio >= self.budget.warn_at else "ok"

    def json(self) -> dict:
        b = self.budget
        return {
            "team": b.team,
            "monthly_usd": b.monthly_micros / MICROS,
            "warn_at": b.warn_at,
            "enforce": b.enforce,
            "max_gpus": b.max_gpus,
            "max_queued_jobs": b.max_queued_jobs,
            "month": self.month,
            "spent_usd": self.spent_micros / MICROS,
            "used_ratio": round(self.used_ratio, 6),
            "state": self.state,
        }

    def spent(self) -> str:
        """`$12.40 of $10.00 spent in 2026-12`."""
        return (
            f"{usd(self.spent_micros)} of {usd(self.budget.monthly_micros)} spent in {self.month}"
        )


class BudgetOps:
    """Budgets behind the API (who may set and see which), their statuses as the API and
    the metrics read them, and the spending computation of the leader's step.
    `accountant`: the ledger's (control.usage.Accountant: its rates and node map)."""

    def __init__(
        self,
        store: Store,
        budgets: BudgetStore,
        usage: UsageStore,
        accountant,
        tokens=None,
        storage=None,
    ):
        self.store, self.budgets, self.usage, self.accountant = store, budgets, usage, accountant
        self.tokens = tokens  # store.token_usage.TokenUsageStore: the gateway's token costs
        self.storage = storage  # store.usage_storage.StorageSamples: the daily storage costs

    # -- spending ---------------------------------------------------------------------

    def statuses(self, now: float | None = None, team: str | None = None) -> list[BudgetStatus]:
        """Every budget (of `team` alone, when given) with what its team spent this month
        as the leader's step last computed it (a few seconds old at most while it leads)."""
        month = month_of(self.usage.clock() if now is None else now)[0]
        budgets = self.budgets.all()
        if team is not None:
            budgets = [b for b in budgets if b.team == team]
        return [BudgetStatus(b, month, b.spent_in(month)) for b in budgets]

    def spending(self, teams: set[str], now: float) -> dict[str, int]:
        """micro-USD per team this month: its ledger (jobs' attempts and replicas' runs that
        ended), its attempts running now (the accountant's node map as of its last step: run
        `ledger` first), its tokens through the gateway and its storage."""
        out = dict.fromkeys(teams, 0)
        if not teams:
            return out
        start = month_of(now)[1]
        for t in self.usage.totals("team", since=start, team=_one(teams)):
            if t.key in out:
                out[t.key] += t.cost_micros
        running = self.store.list_jobs(statuses=[JobStatus.RUNNING], limit=MAX_RUNNING)
        running = [j for j in running if j.team in out]
        prices = self.usage.prices() if running else []
        for j in running:
            out[j.team] += self.accountant.running_cost(j, now, prices)
        if self.tokens is not None:  # tokens through the gateway, priced per million
            for t in self.tokens.totals("team", since=start, team=_one(teams)):
                if t.key in out:
                    out[t.key] += t.cost_micros
        if self.storage is not None:  # the month's daily storage samples, priced per GiB-month
            from aicluster.control.usage_storage import storage_report

            prices = prices or self.usage.prices()
            report = storage_report(self.storage, prices, start, _one(teams))
            for g in report["groups"]:
                if g["key"] in out:
                    out[g["key"]] += g["cost_micros"]
        return out

    # -- the API ------------------------------------------------------------------------

    def list_for(self, who: Principal) -> list[dict]:
        """Admins: every team's budget; members and viewers: their team's."""
        if who.is_admin:
            return [s.json() for s in self.statuses()]
        if not who.team:
            return []
        return [s.json() for s in self.statuses(team=who.team)]

    def put(self, who: Principal, team: str, fields: dict) -> dict:
        """Create or change `team`'s budget with the fields given (monthly_usd, warn_at,
        enforce, max_gpus, max_queued_jobs); the others keep their values."""
        _admin_only(who)
        changes = {}
        for name, value in fields.items():
            if value is None and name in ("monthly_usd", "warn_at", "enforce"):
                raise BadRequest(f"{name}: give a value (it cannot be null)", field=name)
            if name == "monthly_usd":
                changes["monthly_micros"] = round(value * MICROS)
            else:
                changes[name] = value
        if changes.get("monthly_micros") == 0:
            raise BadRequest("monthly_usd: at least $0.000001", field="monthly_usd")
        budget = self.budgets.set(team, changes, actor=who.user)
        if budget is None:
            raise BadRequest(
                f"monthly_usd: team {team} has no budget yet; a new one needs its amount",
                field="monthly_usd",
            )
        month = month_of(self.usage.clock())[0]
        return BudgetStatus(budget, month, budget.spent_in(month)).json()

    def delete(self, who: Principal, team: str) -> dict:
        _admin_only(who)
        if not self.budgets.delete(team, actor=who.user):
            raise NotFoundError(f"team {team!r} has no budget")
        return {"team": team, "deleted": True}

    def check_queue(self, team: str, adding: int = 1) -> None:
        """QueueFull when `adding` more pending jobs would take `team` past its
        max_queued_jobs (checked before the jobs are stored: submits of one team at the
        same moment may pass it together, by as many as are in flight)."""
        budget = self.budgets.get(team)
        if budget is None or budget.max_queued_jobs is None:
            return
        pending = self.budgets.pending_jobs(team)
        if pending + adding > budget.max_queued_jobs:
            more = "" if adding == 1 else f" and {adding} more would pass it"
            raise QueueFull(
                f"team {team} has {pending} pending job(s), its max_queued_jobs cap of "
                f"{budget.max_queued_jobs}{more}: submit again once some have started, or an "
                f"admin can raise it with `aicluster budgets set {team} --max-queued-jobs N`"
            )


class BudgetStep:
    """The leader's budget step, at most every `every_s` seconds: the ledger brought up to
    date (`ledger`), each team's spending and one Event per crossing per month. `limits`
    (each admission) combines that spending with the budgets as stored now: a changed cap,
    amount or enforcement applies at once, new spending within a step."""

    def __init__(
        self,
        ops: BudgetOps,
        ledger: Callable[[], object] = lambda: None,
        every_s: float = 2.0,
        clock=time.monotonic,
    ):
        self.ops, self.ledger, self.every_s, self.clock = ops, ledger, every_s, clock
        self.new_term()

    def new_term(self) -> None:
        """Forget everything: the next `limits()` steps first."""
        self.last = float("-inf")
        self._stepped = False
        self._held: dict[tuple, str] = {}  # (team, month, budget) -> why its work waits

    def tick(self) -> None:
        if self.clock() - self.last >= self.every_s:
            self.step()

    def limits(self) -> tuple[TeamLimit, ...]:
        """The teams' limits: their budgets as stored now, with the spending of the last
        step (the term's first call steps at once)."""
        if not self._stepped:
            self.step()
        return tuple(self._limit(s) for s in self.ops.statuses() if self._limited(s))

    def step(self) -> None:
        self.last = self.clock()
        self.ledger()  # an attempt that just ended is in the ledger, no longer running
        now = self.ops.usage.clock()
        month = month_of(now)[0]
        budgets = self.ops.budgets.all()
        spent = self.ops.spending({b.team for b in budgets}, now)
        self.ops.budgets.record_spending(month, spent)
        self._stepped = True
        statuses = [BudgetStatus(b, month, spent[b.team]) for b in budgets]
        over = [s for s in statuses if s.state == "over"]
        still = {(s.budget.team, s.month, s.budget.monthly_micros) for s in over}
        self._held = {k: v for k, v in self._held.items() if k in still}
        for s in statuses:  # after the spending: whoever sees the Event finds it applied
            self._crossings(s)

    @staticmethod
    def _limited(s: BudgetStatus) -> bool:
        return s.budget.max_gpus is not None or (s.budget.enforce and s.state == "over")

    def _limit(self, s: BudgetStatus) -> TeamLimit:
        b, why = s.budget, None
        if b.enforce and s.state == "over":
            # the sentence of the moment it was held, kept while it holds: a job's wait
            # message (and its Event) changes only when the situation does
            key = (b.team, s.month, b.monthly_micros)
            why = self._held.get(key)
            if why is None:
                why = self._held[key] = (
                    f"team {b.team} is over its monthly budget: {s.spent()}; an admin can "
                    f"raise it with `aicluster budgets set {b.team} --monthly N`"
                )
        return TeamLimit(b.team, b.max_gpus, why)

    def _crossings(self, s: BudgetStatus) -> None:
        b = s.budget
        if s.state in ("warned", "over") and b.last_warned_month != s.month:
            message = (
                f"team {b.team} has spent {s.used_ratio:.0%} of its monthly budget "
                f"({s.spent()}), past its warning threshold of {b.warn_at:.0%}"
            )
            self._record(s, "warned", message)
        if s.state == "over" and b.last_over_month != s.month:
            then = (
                "its new work waits until an admin raises it"
                if b.enforce
                else "not enforced: new work still starts"
            )
            self._record(
                s, "over", f"team {b.team} is over its monthly budget: {s.spent()}; {then}"
            )

    def _record(self, s: BudgetStatus, crossing: str, message: str) -> None:
        if self.ops.budgets.mark(s.budget.team, s.month, crossing, message):
            log_decision(
                decisions,
                "budget_crossed",
                logging.WARNING,
                team=s.budget.team,
                threshold=crossing,
                month=s.month,
                spent_usd=round(s.spent_micros / MICROS, 6),
                budget_usd=s.budget.monthly_micros / MICROS,
            )


class BudgetCollector:
    """aicluster_team_budget_usd, aicluster_team_spent_month_usd and
    aicluster_team_budget_used_ratio per team with a budget, read from the store at scrape
    time (every series has `team`: a member's scoped view shows its own team's alone)."""

    def __init__(self, ops: BudgetOps):
        self.ops = ops

    def describe(self):
        return []

    def collect(self):
        fams = [
            GaugeMetricFamily(name, text, labels=["team"])
            for name, text in (
                ("aicluster_team_budget_usd", "The team's monthly budget (USD)"),
                (
                    "aicluster_team_spent_month_usd",
                    "What the team spent this UTC month (USD): ended attempts and replica "
                    "runs in the usage ledger, its running attempts so far, tokens, storage",
                ),
                ("aicluster_team_budget_used_ratio", "Spent this month / monthly budget"),
            )
        ]
        for s in self.ops.statuses():
            d = s.json()
            for fam, key in zip(fams, ("monthly_usd", "spent_usd", "used_ratio"), strict=True):
                fam.add_metric([s.budget.team], d[key])
        yield from fams


def _one(teams: set[str]) -> str | None:
    """The team to read the ledger of: the only one, or None for all of them."""
    return next(iter(teams)) if len(teams) == 1 else None


def _admin_only(who: Principal) -> None:
    if not who.is_admin:
        raise ForbiddenError("this needs an admin token")
