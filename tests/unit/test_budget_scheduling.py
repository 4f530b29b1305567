"""Team limits in the scheduling cycle (core.model.TeamLimit): a held team's gangs wait
with its reason (`budget`) and hold no one back; a team's cap on GPUs held at once
(`max_gpus`) refuses what would pass it (`team_cap`) under every policy, blocks no other
team's partition, triggers no preemption, and a gang beyond it could never fit. Then the
job loop over a real store: a team over its enforced budget waits while another runs, and
runs once its budget is raised."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from aicluster.control.budgets import BudgetOps, BudgetStep
from aicluster.control.jobs_loop import Controller
from aicluster.control.logs import LogStore
from aicluster.control.usage import Accountant
from aicluster.core.lifecycle import JobStatus
from aicluster.core.model import Admit, Preempt, Quota, TeamLimit, Wait, WaitKind
from aicluster.core.policies.backfill import BackfillPolicy
from aicluster.core.policies.fair import FairPolicy
from aicluster.core.policies.fifo import FifoPolicy
from aicluster.core.scheduler import plan_cycle
from aicluster.specs.job import JobSpec
from aicluster.store.budgets import BudgetStore
from aicluster.store.usage import UsageStore

from builders import by_id, gang, node
from fakes import FakeClock, FakeEngine, open_test_store, settle
from fakes import node as engine_node
from sched_helpers import apply, qsnap, running

POLICIES = ["fifo", "backfill", "fair"]
HELD = "team a is over its monthly budget: $12.40 of $10.00 spent in 2026-12"


def nodes(n=2, gpus=4):
    return [node(f"n{i}", gpus=gpus) for i in range(n)]


@pytest.mark.parametrize("policy", POLICIES)
def test_a_held_teams_gangs_wait_with_its_reason_and_hold_no_one_back(policy):
    first = gang("a1", team="a", gpus=4, submitted_at=0)  # first in every queue
    later = gang("b1", team="b", gpus=4, submitted_at=1)
    snap = replace(
        qsnap(nodes(1), [first, later], running=[running(gang("a0", team="a", gpus=0), ["n0"])]),
        limits=(TeamLimit("a", held=HELD),),
    )
    d = by_id(plan_cycle(snap, 10.0, policy))
    assert d["a1"] == Wait("a1", HELD, WaitKind.BUDGET)
    assert isinstance(d["b1"], Admit)
    assert not [x for x in d.values() if isinstance(x, Preempt)]  # running work goes on


@pytest.mark.parametrize("policy", POLICIES)
def test_the_cap_refuses_what_would_pass_it_under_every_policy(policy):
    held = running(gang("a0", team="a", gpus=2), ["n0"])
    pending = [gang(f"a{i}", team="a", gpus=2, submitted_at=i) for i in (1, 2)]
    pending.append(gang("a3", team="a", cpus=1, submitted_at=3))  # no GPU: never capped
    snap = replace(qsnap(nodes(2), pending, [held]), limits=(TeamLimit("a", max_gpus=4),))
    d = by_id(plan_cycle(snap, 10.0, policy))
    assert isinstance(d["a1"], Admit) and isinstance(d["a3"], Admit)
    assert d["a2"].kind is WaitKind.TEAM_CAP
    assert d["a2"].reason == "team a holds 4 GPUs of its max_gpus cap of 4, needs 2 more"
    free = by_id(plan_cycle(replace(snap, limits=()), 10.0, policy))  # without it: room
    assert isinstance(free["a2"], Admit)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_gang_beyond_the_cap_could_never_fit(policy):
    snap = replace(
        qsnap(nodes(2), [gang("a1", team="a", gpus=6)]), limits=(TeamLimit("a", max_gpus=4),)
    )
    (d,) = plan_cycle(snap, 10.0, policy)
    assert d.never_fits
    assert d.reason == (
        "could never fit: needs 6 GPUs but team a may hold at most 4 at once (its max_gpus cap)"
    )


@pytest.mark.parametrize("policy", ["fifo", "backfill"])
def test_a_capped_head_blocks_no_other_team_of_its_partition(policy):
    """Teams without quotas share a pool's partition; a team its cap holds back is
    skipped, as a job held by its own limit is in Slurm."""
    held = running(gang("a0", team="a", gpus=2), ["n0"])
    head = gang("a1", team="a", gpus=2, submitted_at=0)
    other = gang("b1", team="b", gpus=2, submitted_at=1)
    snap = replace(qsnap(nodes(2), [head, other], [held]), limits=(TeamLimit("a", max_gpus=2),))
    d = by_id(plan_cycle(snap, 10.0, policy))
    assert d["a1"].kind is WaitKind.TEAM_CAP and isinstance(d["b1"], Admit)


def test_a_capped_gang_preempts_no_one_for_its_guarantee():
    quotas = (Quota("a", "default", 4), Quota("b", "default", 0))
    runs = [
        running(gang("a0", team="a", gpus=2), ["n0"]),
        running(gang("b0", team="b", gpus=4), ["n1"]),  # borrows a's guarantee
        running(gang("b1", team="b", gpus=2), ["n0"]),
    ]
    pending = [gang("a1", team="a", gpus=2, submitted_at=1)]
    snap = qsnap(nodes(2), pending, runs, quotas)
    uncapped = plan_cycle(snap, 10.0, "fair")
    assert any(isinstance(x, Preempt) for x in uncapped)  # a reclaims its guarantee
    capped = plan_cycle(replace(snap, limits=(TeamLimit("a", max_gpus=2),)), 10.0, "fair")
    assert capped == [
        Wait("a1", "team a holds 2 GPUs of its max_gpus cap of 2, needs 2 more", WaitKind.TEAM_CAP)
    ]


def test_a_starving_capped_gang_closes_no_cohort_and_keeps_no_gpus():
    fair = FairPolicy(starve_after_s=5.0)
    quotas = (Quota("a", "default", 2), Quota("c", "default", 0))
    runs = [running(gang("a0", team="a", gpus=2), ["n0"])]
    pending = [
        gang("a1", team="a", gpus=2, submitted_at=0),  # starving, capped
        gang("a2", team="a", cpus=1, submitted_at=1),  # the team's later, CPU-only work
        gang("c1", team="c", gpus=2, submitted_at=2),  # borrows from the cohort
    ]
    snap = replace(qsnap(nodes(2), pending, runs, quotas), limits=(TeamLimit("a", max_gpus=2),))
    d = by_id(plan_cycle(snap, 100.0, fair))
    assert d["a1"].kind is WaitKind.TEAM_CAP
    assert isinstance(d["a2"], Admit) and isinstance(d["c1"], Admit)


@pytest.mark.parametrize("make", [FifoPolicy, BackfillPolicy, FairPolicy])
def test_no_team_ever_holds_more_than_its_cap(make):
    """Cycles applied one after another with one policy object (its state kept across
    cycles), caps changing between them: every cycle's admissions keep each team within
    its cap, as the snapshot of that cycle says it."""
    rng = random.Random(7)
    policy = make()
    teams = ("a", "b", "c")
    snap = qsnap(nodes(4, gpus=8), [])
    seq = 0
    for cycle in range(60):
        caps = {t: rng.choice([None, 0, 2, 4, 8]) for t in teams}
        arrivals = []
        for _ in range(rng.randint(0, 3)):
            seq += 1
            team = rng.choice(teams)
            arrivals.append(
                gang(f"g{seq}", team=team, gpus=rng.choice([0, 1, 2, 4]), submitted_at=cycle)
            )
        limits = tuple(TeamLimit(t, max_gpus=c) for t, c in caps.items() if c is not None)
        snap = replace(snap, pending=snap.pending + tuple(arrivals), limits=limits)
        decisions = plan_cycle(snap, float(cycle), policy)
        held = {t: sum(r.gang.total.gpus for r in snap.running if r.gang.team == t) for t in teams}
        gangs = {g.workload_id: g for g in snap.pending}
        admitted = {t: 0 for t in teams}
        for d in decisions:
            if isinstance(d, Admit):
                admitted[gangs[d.workload_id].team] += gangs[d.workload_id].total.gpus
        for t in teams:
            if caps[t] is not None and admitted[t]:
                assert held[t] + admitted[t] <= caps[t], (cycle, t)
        snap = apply(snap, decisions, float(cycle))
        done = [r for r in snap.running if rng.random() < 0.3]  # some end
        snap = qsnap(
            [replace(n, allocated=type(n.allocated)()) for n in snap.nodes],
            snap.pending,
            [r for r in snap.running if r not in done],
        )


# -- the job loop -------------------------------------------------------------------


class Loop:
    """The job loop over a real SQLite store and a fake engine (one 4-GPU node), with the
    leader's budget step giving it the teams' limits."""

    def __init__(self, tmp_path, template):
        self.clock = FakeClock(1_796_000_000.0)  # 2026-11-28
        self.store = open_test_store(tmp_path, self.clock, ("ml", "cv"), template)
        self.engine = FakeEngine([engine_node("n1", gpus=4, cpus=8, pool="gpu", gpu_model="H100")])
        usage = UsageStore(self.store)
        usage.set_price(None, "H100", {"gpu_hour": 3.6}, 0.0)  # a GPU-second: $0.001
        accountant = Accountant(usage, nodes=lambda: self.ctrl.nodes, clock=self.clock)
        self.budgets = BudgetStore(self.store)
        ops = BudgetOps(self.store, self.budgets, usage, accountant)
        self.step = BudgetStep(ops, ledger=accountant.step, clock=self.clock)
        self.ctrl = Controller(
            self.store,
            self.engine,
            LogStore(tmp_path / "logs"),
            tmp_path / "workdirs",
            tmp_path,
            clock=self.clock,
            limits=self.step.limits,
        )

    def submit(self, team: str, gpus: int = 1) -> str:
        spec = JobSpec(name="train", team=team, resources={"gpus": gpus}, command="x")
        return self.store.create_job(spec, "admin").id

    def tick(self) -> None:
        self.ctrl.tick()
        settle(self.ctrl)
        self.step.tick()

    def close(self) -> None:
        self.ctrl.close()
        self.store.close()


@pytest.fixture
def loop(tmp_path, store_template):
    w = Loop(tmp_path, store_template)
    yield w
    w.close()


def test_over_an_enforced_budget_new_jobs_wait_and_a_raise_lets_them_run(loop):
    w = loop
    w.budgets.set("ml", {"monthly_micros": 10_000, "enforce": True})  # 10 GPU-seconds
    first = w.submit("ml")
    w.tick()
    w.tick()
    assert w.store.get_job(first).status == JobStatus.RUNNING
    w.clock.advance(12)
    w.tick()  # the step sees 12 GPU-seconds: over
    held = w.submit("ml")
    other = w.submit("cv")
    w.tick()
    job = w.store.get_job(held)
    assert job.status == JobStatus.PENDING and job.wait_kind is WaitKind.BUDGET
    assert job.message == (
        "team ml is over its monthly budget: $0.012 of $0.01 spent in 2026-11; an admin can "
        "raise it with `aicluster budgets set ml --monthly N`"
    )
    assert w.store.get_job(other).status in (JobStatus.ADMITTED, JobStatus.RUNNING)
    assert w.store.get_job(first).status == JobStatus.RUNNING  # running work goes on
    w.clock.advance(5)
    w.tick()
    waits = [e for e in w.store.list_events(object_id=held) if e.type == "JobWaiting"]
    assert len(waits) == 1  # its reason did not change as the running job accrued
    w.budgets.set("ml", {"monthly_micros": 100_000_000})
    w.clock.advance(2)
    w.tick()  # the step sees the raise
    w.tick()
    assert w.store.get_job(held).status in (JobStatus.ADMITTED, JobStatus.RUNNING)


def test_the_cap_keeps_a_teams_second_job_waiting_naming_max_gpus(loop):
    w = loop
    w.budgets.set("ml", {"monthly_micros": 100_000_000, "max_gpus": 2})
    first = w.submit("ml", gpus=2)
    w.clock.advance(1)  # queue order: by submission
    second = w.submit("ml", gpus=1)
    w.tick()
    assert w.store.get_job(first).status == JobStatus.ADMITTED
    job = w.store.get_job(second)
    assert job.wait_kind is WaitKind.TEAM_CAP and "max_gpus cap of 2" in job.message
    too_big = w.submit("ml", gpus=3)
    w.tick()
    assert w.store.get_job(too_big).wait_kind is WaitKind.NEVER_FITS
