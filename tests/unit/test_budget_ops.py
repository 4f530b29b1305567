"""Team budgets over a real store (SQLite and PostgreSQL) and a fake clock: the store's
partial updates and compare-and-set crossings, what a team spent this month (the ledger's
daily sums plus its attempts running now, at the ledger's own rates), exactly one Event
per crossing per month across repeated steps and restarts, the limits the step hands the
scheduler, the max_queued_jobs cap at submit, and who may do what."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from aicluster.control.api_ops import ApiOps, BadRequest, ForbiddenError, NotFoundError
from aicluster.control.budgets import BudgetOps, BudgetStep, QueueFull, month_of
from aicluster.control.usage import Accountant
from aicluster.core.lifecycle import JobStatus as S
from aicluster.core.lifecycle import Reason
from aicluster.core.model import TeamLimit
from aicluster.specs.job import JobSpec
from aicluster.store import open_store
from aicluster.store.budgets import BudgetStore, usd
from aicluster.store.errors import NotFound
from aicluster.store.identity import Principal
from aicluster.store.usage import UsageStore

from fakes import FakeClock, node

ADMIN = Principal("admin", None, "admin")
ALICE = Principal("alice", "ml", "member")
NODES = [node("n1", gpus=8, pool="train", gpu_model="H100")]
# 2026-11-30 23:00 UTC: an hour before December
LATE_NOVEMBER = datetime(2026, 11, 30, 23, 0, tzinfo=UTC).timestamp()
GPU_HOUR = 3.6  # USD: one GPU-second costs 1000 micro-USD


class World:
    def __init__(self, url: str, now: float = LATE_NOVEMBER):
        self.clock = FakeClock(now)
        self.store = open_store(url, clock=self.clock)
        for team in ("ml", "cv"):
            self.store.create_team(team)
        self.store.create_user("admin", None, "admin")
        self.usage = UsageStore(self.store)
        self.usage.set_price(None, "H100", {"gpu_hour": GPU_HOUR}, 0.0)
        self.accountant = Accountant(self.usage, nodes=lambda: NODES, clock=self.clock)
        self.budgets = BudgetStore(self.store)
        self.ops = BudgetOps(self.store, self.budgets, self.usage, self.accountant)

    def step(self) -> BudgetStep:
        """The leader's step as a new term builds it (nothing remembered)."""
        return BudgetStep(self.ops, ledger=self.accountant.step, clock=self.clock)

    def job(self, team: str = "ml", gpus: int = 1) -> str:
        spec = JobSpec(name="train", team=team, resources={"gpus": gpus}, command="true")
        return self.store.create_job(spec, "admin").id

    def start(self, job_id: str) -> None:
        self.store.transition(
            job_id, S.PENDING, S.ADMITTED, Reason.ADMITTED, attempt=1, placement=["n1"]
        )
        self.store.transition(job_id, S.ADMITTED, S.RUNNING, Reason.STARTED)

    def finish(self, job_id: str) -> None:
        self.store.transition(job_id, S.RUNNING, S.SUCCEEDED, Reason.COMPLETED)

    def spent(self, team: str = "ml") -> int:
        return self.ops.spending({team}, self.clock())[team]

    def events(self, type_: str) -> list:
        return [e for e in self.store.list_events() if e.type == type_]


@pytest.fixture
def world(state_url):
    w = World(state_url)
    yield w
    w.store.close()


def test_months_are_utc_calendar_months():
    assert month_of(LATE_NOVEMBER) == ("2026-11", datetime(2026, 11, 1, tzinfo=UTC).timestamp())
    assert month_of(LATE_NOVEMBER + 3600)[0] == "2026-12"
    assert (usd(12_400_000), usd(2_083), usd(0)) == ("$12.40", "$0.002083", "$0.00")


def test_set_changes_only_the_fields_given(world):
    b = world.budgets
    assert b.set("ml", {"warn_at": 0.5}) is None  # a new budget needs its amount
    made = b.set("ml", {"monthly_micros": 10_000_000}, actor="admin")
    assert (made.warn_at, made.enforce, made.max_gpus, made.max_queued_jobs) == (
        0.8,
        False,
        None,
        None,
    )
    b.set("ml", {"enforce": True, "max_gpus": 4})
    changed = b.set("ml", {"monthly_micros": 20_000_000, "max_gpus": None})
    assert (changed.monthly_micros, changed.enforce, changed.max_gpus) == (20_000_000, True, None)
    assert b.get("cv") is None and [x.team for x in b.all()] == ["ml"]
    with pytest.raises(NotFound):
        b.set("nobody", {"monthly_micros": 1})
    assert [e.actor for e in world.events("BudgetSet")][:1] == ["admin"]
    assert "$10.00 a month, warn at 80%, not enforced" in world.events("BudgetSet")[0].message
    assert b.delete("ml", actor="admin") and not b.delete("ml")
    assert b.get("ml") is None and len(world.events("BudgetDeleted")) == 1


def test_a_crossing_is_marked_once_a_month(world):
    b = world.budgets
    assert not b.mark("ml", "2026-11", "over", "no budget yet")
    b.set("ml", {"monthly_micros": 1})
    assert b.mark("ml", "2026-11", "over", "over")
    assert not b.mark("ml", "2026-11", "over", "again")
    assert b.mark("ml", "2026-11", "warned", "warned")  # another threshold
    assert not b.mark("ml", "2026-10", "over", "a clock gone back")
    assert b.mark("ml", "2026-12", "over", "a new month")
    assert [e.message for e in world.events("BudgetExceeded")] == ["over", "a new month"]
    assert {e.team for e in world.events("BudgetExceeded")} == {"ml"}


def test_spent_is_this_months_ledger_plus_what_runs_now(world):
    w = world
    w.budgets.set("ml", {"monthly_micros": 10_000_000})
    w.budgets.set("cv", {"monthly_micros": 10_000_000})
    november = w.job()
    w.start(november)
    w.clock.advance(600)  # 600 GPU-seconds in November: $0.60
    w.finish(november)
    w.accountant.step()
    assert w.spent() == 600_000
    w.clock.advance(3000)  # now 2026-12-01 00:00
    assert month_of(w.clock())[0] == "2026-12"
    assert w.spent() == 0  # a line belongs to the month its attempt ended in
    running = w.job(gpus=2)
    w.start(running)
    w.clock.advance(10)
    assert w.spent() == 20_000  # accrued: 2 GPUs x 10 s, not yet in the ledger
    w.clock.advance(5)
    w.finish(running)
    w.accountant.step()
    assert w.spent() == 30_000  # now the ledger's line, counted once
    (line,) = [x for x in w.usage.lines() if x.job_id == running]
    assert line.cost_micros == 30_000
    assert w.spent("cv") == 0
    (status,) = w.ops.statuses(team="ml")
    assert status.spent_micros == 0  # the API reads what the leader's step stored
    w.step().step()
    (status,) = w.ops.statuses(team="ml")
    assert status.json() == {
        "team": "ml",
        "monthly_usd": 10.0,
        "warn_at": 0.8,
        "enforce": False,
        "max_gpus": None,
        "max_queued_jobs": None,
        "month": "2026-12",
        "spent_usd": 0.03,
        "used_ratio": 0.003,
        "state": "ok",
    }


def test_running_cost_is_what_the_ledger_line_will_say(world):
    w = world
    job_id = w.job(gpus=3)
    w.start(job_id)
    w.clock.advance(1234.5)
    prices = w.usage.prices()
    w.accountant.step()  # learns the nodes; the attempt still runs: no line
    accrued = w.accountant.running_cost(w.store.get_job(job_id), w.clock(), prices)
    w.finish(job_id)
    w.accountant.step()
    (line,) = w.usage.lines()
    assert accrued == line.cost_micros == round(3 * 1234.5 * 1000)


def test_each_crossing_is_one_event_across_steps_and_restarts(world):
    w = world
    w.budgets.set("ml", {"monthly_micros": 10_000, "enforce": True})  # $0.01: 10 GPU-seconds
    job_id = w.job()
    w.start(job_id)
    w.clock.advance(5)
    w.step().step()
    assert w.events("BudgetWarning") == [] == w.events("BudgetExceeded")
    w.clock.advance(3)  # 8 s: 80%
    step = w.step()
    step.step()
    step.step()
    (warned,) = w.events("BudgetWarning")
    assert warned.team == "ml" and warned.reason == "warned"
    assert "80% of its monthly budget ($0.008 of $0.01 spent in 2026-11)" in warned.message
    assert w.events("BudgetExceeded") == [] and step.limits() == ()
    w.clock.advance(4)  # 12 s: over
    w.finish(job_id)
    for _ in range(3):  # the same control plane, then restarted ones
        w.step().step()
        step.step()
    (over,) = w.events("BudgetExceeded")
    assert over.message == (
        "team ml is over its monthly budget: $0.012 of $0.01 spent in 2026-11; "
        "its new work waits until an admin raises it"
    )
    assert len(w.events("BudgetWarning")) == 1
    (limit,) = step.limits()
    assert limit.team == "ml" and limit.max_gpus is None
    assert limit.held == (
        "team ml is over its monthly budget: $0.012 of $0.01 spent in 2026-11; an admin can "
        "raise it with `aicluster budgets set ml --monthly N`"
    )
    w.clock.advance(3600)  # December: a new month crosses again, once
    again = w.job()
    w.start(again)
    w.clock.advance(20)
    w.step().step()
    w.step().step()
    assert len(w.events("BudgetExceeded")) == 2 and len(w.events("BudgetWarning")) == 2


def test_both_thresholds_at_once_warn_first_and_an_unenforced_budget_holds_nothing(world):
    w = world
    w.budgets.set("ml", {"monthly_micros": 1_000, "max_gpus": 3})
    job_id = w.job()
    w.start(job_id)
    w.clock.advance(30)
    step = w.step()
    step.step()
    types = [e.type for e in w.store.list_events() if e.type.startswith("Budget")]
    assert types[-2:] == ["BudgetWarning", "BudgetExceeded"]
    assert "not enforced: new work still starts" in w.events("BudgetExceeded")[0].message
    (limit,) = step.limits()
    assert (limit.max_gpus, limit.held) == (3, None)  # the cap holds whatever the budget


def test_the_held_reason_stays_while_the_team_stays_held(world):
    """A job's wait message (and its JobWaiting Event) changes only when the situation
    does, not as running work accrues."""
    w = world
    w.budgets.set("ml", {"monthly_micros": 1_000, "enforce": True})
    job_id = w.job()
    w.start(job_id)
    w.clock.advance(5)
    step = w.step()
    step.step()
    first = step.limits()[0].held
    w.clock.advance(50)
    step.step()
    assert step.limits()[0].held == first
    w.budgets.set("ml", {"monthly_micros": 2_000})  # still over, a new amount: a new sentence
    step.step()
    assert "of $0.002 spent" in step.limits()[0].held
    w.budgets.set("ml", {"monthly_micros": 10_000_000})
    step.step()
    assert step.limits() == ()


def test_a_changed_budget_or_cap_applies_at_once_new_spending_within_a_step(world):
    w = world
    w.budgets.set("ml", {"monthly_micros": 1_000, "enforce": True})
    job_id = w.job()
    w.start(job_id)
    w.clock.advance(5)
    step = w.step()
    assert step.limits()[0].held is not None
    w.budgets.set("ml", {"monthly_micros": 100_000_000, "max_gpus": 3})
    assert step.limits() == (TeamLimit("ml", 3, None),)  # no step in between
    w.budgets.set("ml", {"monthly_micros": 1_000, "enforce": False})
    assert step.limits() == (TeamLimit("ml", 3, None),)
    w.budgets.set("cv", {"monthly_micros": 1, "enforce": True})
    assert step.limits() == (TeamLimit("ml", 3, None),)  # cv's spending: at the next step


def test_a_new_term_computes_the_limits_before_its_first_admission(world):
    w = world
    w.budgets.set("ml", {"monthly_micros": 1_000, "enforce": True})
    job_id = w.job()
    w.start(job_id)
    w.clock.advance(5)
    w.finish(job_id)  # ended, its line not written yet
    step = w.step()
    (limit,) = step.limits()  # steps at once, the ledger brought up to date first
    assert limit.held is not None and "$0.005 of $0.001" in limit.held
    step.new_term()
    w.budgets.delete("ml")
    assert step.limits() == ()
    ticks = w.step()
    ticks.every_s = 10
    ticks.tick()
    w.budgets.set("ml", {"monthly_micros": 1_000, "enforce": True})
    w.clock.advance(5)
    ticks.tick()
    assert ticks.limits() == ()  # not yet due
    w.clock.advance(5)
    ticks.tick()
    assert len(ticks.limits()) == 1


def test_who_may_set_and_see_budgets(world):
    ops = world.ops
    with pytest.raises(ForbiddenError):
        ops.put(ALICE, "ml", {"monthly_usd": 5.0})
    with pytest.raises(BadRequest) as exc:
        ops.put(ADMIN, "ml", {"warn_at": 0.5})
    assert exc.value.field == "monthly_usd"
    with pytest.raises(BadRequest) as exc:
        ops.put(ADMIN, "ml", {"monthly_usd": 5.0, "enforce": None})
    assert exc.value.field == "enforce"
    with pytest.raises(NotFound):
        ops.put(ADMIN, "nobody", {"monthly_usd": 5.0})
    made = ops.put(ADMIN, "ml", {"monthly_usd": 12.5, "max_queued_jobs": 2})
    assert (made["monthly_usd"], made["max_queued_jobs"], made["state"]) == (12.5, 2, "ok")
    ops.put(ADMIN, "cv", {"monthly_usd": 1.0})
    assert [b["team"] for b in ops.list_for(ADMIN)] == ["cv", "ml"]
    assert [b["team"] for b in ops.list_for(ALICE)] == ["ml"]
    assert ops.list_for(Principal("vera", "cv", "viewer"))[0]["team"] == "cv"
    with pytest.raises(ForbiddenError):
        ops.delete(ALICE, "ml")
    assert ops.delete(ADMIN, "ml") == {"team": "ml", "deleted": True}
    with pytest.raises(NotFoundError):
        ops.delete(ADMIN, "ml")


def test_max_queued_jobs_refuses_a_submit_naming_the_cap(world, tmp_path):
    w = world
    api = ApiOps(w.store, engine=None, logs=None, workdirs=tmp_path, budgets=w.ops)
    spec = {"kind": "job", "name": "q", "team": "ml", "command": "true"}
    api.submit(ADMIN, spec, None)
    api.submit(ADMIN, spec, None)  # no cap yet
    w.ops.put(ADMIN, "ml", {"monthly_usd": 100.0, "max_queued_jobs": 2})
    with pytest.raises(QueueFull) as exc:
        api.submit(ADMIN, spec, None)
    assert exc.value.field == "max_queued_jobs"
    assert "team ml has 2 pending job(s), its max_queued_jobs cap of 2" in str(exc.value)
    api.submit(ADMIN, dict(spec, team="cv"), None)  # another team's queue is its own
    first = w.store.list_jobs(team="ml")[-1]
    w.start(first.id)  # one leaves the queue: room for one more
    api.submit(ADMIN, spec, None)
    assert w.budgets.pending_jobs("ml") == 2


def test_tokens_and_storage_count_against_the_budget(world):
    from aicluster.store.token_usage import TokenUsageStore
    from aicluster.store.usage_storage import StorageSamples

    w = world
    w.clock.advance(3600)  # 2026-12-01 00:00 UTC
    tokens, storage = TokenUsageStore(w.store), StorageSamples(w.store)
    ops = BudgetOps(w.store, w.budgets, w.usage, w.accountant, tokens=tokens, storage=storage)
    row = {"minute": int(w.clock() // 60), "user": "alice", "token_id": 7, "model": "m"}
    row |= {"service": "ml/chat", "requests": 3, "errors": 0}
    row |= {"prompt_tokens": 1000, "completion_tokens": 500, "cost_micros": 250_000}
    assert tokens.add_batch("b1", "gw", [{**row, "team": "ml"}, {**row, "team": "cv"}])
    w.usage.set_price(None, None, {"storage_gib_month": 73.0}, 0.0)  # $0.10 per GiB-hour
    storage.put(int(w.clock() // 86400), {("ml", "artifacts"): 2**30})  # one GiB, one day
    day = 73.0 / 730 * 24 * 1e6  # micro-USD: a GiB-day at $73 per GiB-month
    assert ops.spending({"ml"}, w.clock()) == {"ml": 250_000 + round(day)}
    assert ops.spending({"cv"}, w.clock()) == {"cv": 250_000}
    assert w.ops.spending({"ml"}, w.clock()) == {"ml": 0}, "without them: compute alone"
