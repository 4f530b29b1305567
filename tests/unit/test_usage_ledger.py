"""The usage ledger over a real SQLite store and a fake clock: one line per ended attempt,
GPU-seconds to the second, preempted and node-lost attempts attributed, idempotent
accounting (the cursor and the lines commit together), prices in force at the start."""

from __future__ import annotations

import pytest

from aicluster.control.api_ops import BadRequest, NotFoundError
from aicluster.control.usage import Accountant, GpuCatalog, UsageOps, parse_since, rates_at
from aicluster.core.lifecycle import JobStatus as S
from aicluster.core.lifecycle import Reason, RequeueCause
from aicluster.specs.job import JobSpec
from aicluster.store import open_store
from aicluster.store.identity import Principal
from aicluster.store.usage import UsageStore

from fakes import FakeClock, node

GiB = 2**30
NODES = [
    node("n1", gpus=8, pool="train", gpu_model="H100"),
    node("n2", gpus=8, pool="train", gpu_model="H100"),
    node("c1", gpus=0, pool="cpu"),
]


@pytest.fixture
def env(state_url):
    """SQLite and PostgreSQL (tests/pgserver.py): teams a and b, an admin."""
    clock = FakeClock()
    store = open_store(state_url, clock=clock)
    for team in ("a", "b"):
        store.create_team(team)
    store.create_user("admin", None, "admin")
    usage = UsageStore(store)
    acct = Accountant(usage, nodes=lambda: NODES, clock=clock, every_s=0)
    yield store, usage, acct, clock
    store.close()


def submit(store, name, team="a", workers=1, gpus=1, cpus=2.0, memory=4 * GiB, owner="u"):
    spec = JobSpec(
        name=name,
        team=team,
        workers=workers,
        resources={"gpus": gpus, "cpus": cpus, "memory": memory},
        command="true",
        max_restarts=5,
    )
    return store.create_job(spec, owner)


def run_attempt(store, clock, job_id, placement, seconds, end, cause=None, launch_s=3.0):
    """Admit, start after `launch_s`, run `seconds`, end into `end`."""
    job = store.get_job(job_id)
    store.transition(
        job_id, S.PENDING, S.ADMITTED, Reason.ADMITTED, attempt=job.attempt + 1, placement=placement
    )
    clock.advance(launch_s)
    store.transition(job_id, S.ADMITTED, S.RUNNING, Reason.STARTED)
    clock.advance(seconds)
    if cause is not None:
        store.transition(
            job_id, S.RUNNING, S.PENDING, Reason.REQUEUED, requeue_cause=cause, placement=None
        )
    else:
        store.transition(job_id, S.RUNNING, end, Reason.COMPLETED)


def test_gpu_seconds_sum_over_attempts_with_preempted_and_node_lost(env):
    store, usage, acct, clock = env
    job = submit(store, "train", workers=2, gpus=4)
    run_attempt(store, clock, job.id, ["n1", "n2"], 100, None, RequeueCause.PREEMPTED)
    clock.advance(7)
    run_attempt(store, clock, job.id, ["n1", "n2"], 250, None, RequeueCause.NODE_LOST)
    clock.advance(5)
    run_attempt(store, clock, job.id, ["n2", "n1"], 1000, S.SUCCEEDED)
    assert acct.tick() == 3
    lines = usage.lines()
    assert [(x.attempt, x.end_reason) for x in lines] == [
        (1, "preempted"),
        (2, "node_lost"),
        (3, "completed"),
    ]
    assert [x.gpu_ms for x in lines] == [8 * 100_000, 8 * 250_000, 8 * 1_000_000]
    assert sum(x.gpu_ms for x in lines) == 8 * 1350 * 1000  # to the second
    assert [x.cpu_ms for x in lines] == [4 * 100_000, 4 * 250_000, 4 * 1_000_000]
    assert lines[0].memory_gib_ms == 8 * 100_000  # 2 workers x 4 GiB x 100 s
    first = lines[0]
    assert (first.team, first.user, first.pool, first.gpu_model) == ("a", "u", "train", "H100")
    assert first.nodes == ["n1", "n2"] and first.workers == 2 and first.gpus == 8
    assert first.ended_at - first.started_at == 100
    (total,) = usage.totals(None)
    assert total.gpu_ms == 8 * 1350 * 1000
    assert total.lost_gpu_ms == 8 * 350 * 1000  # preempted + node lost, attributed


def test_an_attempt_that_never_ran_costs_nothing(env):
    store, usage, acct, clock = env
    usage.set_price(None, None, {"gpu_hour": 10.0, "cpu_hour": 1.0}, 0.0)
    job = submit(store, "nolaunch")
    store.transition(job.id, S.PENDING, S.ADMITTED, Reason.ADMITTED, attempt=1, placement=["n1"])
    clock.advance(30)
    store.transition(
        job.id,
        S.ADMITTED,
        S.PENDING,
        Reason.REQUEUED,
        requeue_cause=RequeueCause.LAUNCH_FAILED,
        placement=None,
    )
    acct.tick()
    (line,) = usage.lines()
    assert line.started_at is None and line.end_reason == "launch_failed"
    assert (line.run_ms, line.gpu_ms, line.cpu_ms, line.cost_micros) == (0, 0, 0, 0)


def test_running_attempts_wait_and_accounting_twice_counts_once(env):
    store, usage, acct, clock = env
    job = submit(store, "long")
    store.transition(job.id, S.PENDING, S.ADMITTED, Reason.ADMITTED, attempt=1, placement=["n1"])
    store.transition(job.id, S.ADMITTED, S.RUNNING, Reason.STARTED)
    assert acct.tick() == 0 and usage.lines() == []  # still running: no line yet
    clock.advance(60)
    store.transition(job.id, S.RUNNING, S.SUCCEEDED, Reason.COMPLETED)
    assert acct.tick() == 1
    assert acct.tick() == 0
    # Even from scratch (a lost cursor), the (job, attempt) key keeps it one line.
    with store.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE usage_cursor SET event_id = 0")
    assert acct.step() == 0
    assert len(usage.lines()) == 1 and usage.totals(None)[0].gpu_ms == 60_000


def test_a_crash_mid_accounting_leaves_neither_gap_nor_double_count(env):
    """The lines and the cursor are one transaction: when writing fails part-way, neither
    is kept; the next run writes every line once."""
    store, usage, acct, clock = env
    for name in ("j1", "j2", "j3"):
        job = submit(store, name)
        run_attempt(store, clock, job.id, ["n1"], 10, S.SUCCEEDED)
    calls = []

    def crashing(job, a, prices):
        calls.append(job.id)
        if len(calls) == 2:
            raise SystemExit("kill -9")  # stands for the process dying mid-transaction
        return acct.line(job, a, prices)

    with pytest.raises(SystemExit):
        usage.account(crashing)
    assert usage.lines() == [] and usage.cursor() == 0
    assert acct.tick() == 3
    cursor = usage.cursor()
    assert cursor > 0 and acct.tick() == 0 and usage.cursor() == cursor
    assert len({x.job_id for x in usage.lines()}) == 3 and usage.totals(None)[0].lines == 3


def test_the_cursor_moves_in_batches(env):
    store, usage, acct, clock = env
    acct.batch = 3
    for name in ("b1", "b2", "b3", "b4"):
        job = submit(store, name)
        run_attempt(store, clock, job.id, ["n1"], 10, S.SUCCEEDED)
    written = [acct.step() for _ in range(8)]
    assert sum(written) == 4 and len(usage.lines()) == 4


def test_cost_uses_the_price_in_force_at_the_start(env):
    store, usage, acct, clock = env
    t0 = clock.now
    usage.set_price(None, "H100", {"gpu_hour": 2.0}, t0)
    usage.set_price(None, None, {"cpu_hour": 0.5, "memory_gib_hour": 0.01}, t0)
    usage.set_price("train", "h100-sxm", {"gpu_hour": 3.0}, t0 + 1000)  # catalog alias of H100
    before = submit(store, "before")
    run_attempt(store, clock, before.id, ["n1"], 3600, S.SUCCEEDED)  # starts before t0+1000
    clock.now = t0 + 2000
    after = submit(store, "after")
    run_attempt(store, clock, after.id, ["n1"], 1800, S.SUCCEEDED)
    acct.tick()
    a, b = sorted(usage.lines(), key=lambda x: x.started_at)
    # one GPU, 2 CPUs, 4 GiB: an hour at 2.0 + 2 x 0.5 + 4 x 0.01
    assert (a.gpu_hour, a.cpu_hour, a.memory_gib_hour, a.price_source) == (2.0, 0.5, 0.01, "set")
    assert a.cost_micros == 3_040_000
    assert b.gpu_hour == 3.0 and b.cpu_hour == 0.5  # the pool's GPU rate, the global CPU rate
    assert b.cost_micros == 2_020_000  # half an hour at 3.0 + 1.0 + 0.04


def test_the_catalog_prices_a_gpu_no_admin_priced(env):
    store, usage, acct, clock = env
    job = submit(store, "dflt")
    run_attempt(store, clock, job.id, ["n1"], 3600, S.SUCCEEDED)
    acct.tick()
    (line,) = usage.lines()
    assert line.price_source == "catalog" and line.cpu_hour == 0.0
    assert line.gpu_hour == pytest.approx(30000 / (36 * 730))  # H100 SXM over 36 months
    cpu_only = rates_at([], "cpu", None, 0.0, GpuCatalog())
    assert (cpu_only.gpu_hour, cpu_only.source) == (0.0, "none")


def test_reports_by_grouping_reconcile_with_the_lines(env):
    store, usage, acct, clock = env
    usage.set_price(None, None, {"gpu_hour": 1.7, "cpu_hour": 0.13}, clock.now)
    for team, user, gpus, secs in [("a", "ann", 2, 333), ("a", "al", 1, 71), ("b", "bo", 4, 29)]:
        job = submit(store, f"r-{user}", team=team, gpus=gpus, owner=user)
        run_attempt(store, clock, job.id, ["n1"], secs, S.SUCCEEDED)
    acct.tick()
    lines = usage.lines()
    (total,) = usage.totals(None)
    for by in ("team", "user", "job", "pool", "gpu_model", "end_reason"):
        groups = usage.totals(by)
        for f in ("lines", "gpu_ms", "cpu_ms", "memory_gib_ms", "cost_micros"):
            assert sum(getattr(g, f) for g in groups) == getattr(total, f)
    assert total.cost_micros == sum(x.cost_micros for x in lines)
    by_team = {g.key: g.gpu_ms for g in usage.totals("team")}
    assert by_team == {"a": (2 * 333 + 71) * 1000, "b": 4 * 29 * 1000}
    assert usage.totals("team", team="b")[0].key == "b"
    assert usage.totals(None, since=clock.now + 1)[0].lines == 0


def test_usage_ops_scopes_members_to_their_team_and_names_bad_fields(env):
    store, usage, acct, clock = env
    ops = UsageOps(usage, store.team_exists)
    admin = Principal("admin", None, "admin")
    member = Principal("m", "b", "member")
    for team in ("a", "b"):
        job = submit(store, f"s-{team}", team=team)
        run_attempt(store, clock, job.id, ["n1"], 10, S.SUCCEEDED)
    acct.tick()
    assert {g["key"] for g in ops.report(admin, "7d", None, "team")["groups"]} == {"a", "b"}
    assert {g["key"] for g in ops.report(member, "7d", None, "team")["groups"]} == {"b"}
    assert {x["team"] for x in ops.lines(member, "7d", None, 100, 0)} == {"b"}
    with pytest.raises(NotFoundError):
        ops.report(member, "7d", "a", "team")
    with pytest.raises(NotFoundError):
        ops.report(admin, "7d", "nope", "team")
    for since, by, field in [("7x", "team", "since"), ("7d", "nope", "by")]:
        with pytest.raises(BadRequest) as exc:
            ops.report(admin, since, None, by)
        assert exc.value.field == field and field in str(exc.value)
    with pytest.raises(BadRequest) as exc:
        ops.set_price(admin, None, "H100", {}, None)
    assert exc.value.field == "gpu_hour"
    with pytest.raises(BadRequest) as exc:
        ops.set_price(admin, None, "H100", {"gpu_hour": 1.0}, clock.now - 3600)
    assert exc.value.field == "effective_from"


def test_parse_since():
    assert parse_since("7d", 1e6) == 1e6 - 7 * 86400
    assert parse_since("90s", 100.0) == 10.0
    assert parse_since("1970-01-02", 0) == 86400
    for bad in ("7x", "", "-1d", "99999999w"):
        with pytest.raises(BadRequest):
            parse_since(bad, 0)


def test_daily_sums_give_the_same_totals_as_the_lines(env):
    """Reports read whole days from the daily sums and the first, partial day from the
    lines; the figures equal the lines' own sums for any `since`."""
    store, usage, acct, clock = env
    usage.set_price(None, None, {"gpu_hour": 1.3, "cpu_hour": 0.07}, clock.now)
    for i in range(12):  # ends spread over four days, a quarter of them preempted
        job = submit(store, f"d{i}", team="ab"[i % 2], gpus=1 + i % 3, owner=f"u{i % 3}")
        cause = RequeueCause.PREEMPTED if i % 4 == 0 else None
        run_attempt(store, clock, job.id, ["n1" if i % 2 else "c1"], 600 + i, S.SUCCEEDED, cause)
        clock.advance(8 * 3600 + 17)
    assert acct.tick() == 12
    lines = usage.lines()
    for since in (None, 0.0, lines[3].ended_at, lines[3].ended_at + 1, clock.now - 86400):
        for by in (None, "team", "user", "pool", "gpu_model"):
            fast = usage.totals(by, since=since)
            slow = usage.totals(by, since=since, until=clock.now + 1)  # lines only
            assert fast == slow, (since, by)
        (total,) = usage.totals(None, since=since)
        want = [x for x in lines if since is None or x.ended_at >= since]
        assert total.lines == len(want)
        assert total.cost_micros == sum(x.cost_micros for x in want)
        lost = sum(x.gpu_ms for x in want if x.end_reason == "preempted")
        assert total.lost_gpu_ms == lost


ACCOUNT_IN_BATCHES = """
import sys
from aicluster.control.usage import Accountant
from aicluster.store import open_store
from aicluster.store.usage import UsageStore

usage = UsageStore(open_store(sys.argv[1]))
acct = Accountant(usage, nodes=lambda: [], every_s=0)
for _go in sys.stdin:  # one batch per line the test sends: it decides when to kill
    usage.account(acct.line, limit=40)  # about 10 jobs' events a transaction
    print(usage.cursor(), flush=True)
"""


def test_an_accountant_killed_9_mid_way_leaves_neither_gap_nor_double_count(env, state_url):
    """A real process accounts a backlog in many transactions and is killed with SIGKILL
    part-way; another accountant finishes: every ended attempt is one line, to the ms."""
    import signal
    import subprocess
    import sys

    store, usage, _, clock = env
    jobs = 120
    for i in range(jobs):
        job = submit(store, f"k{i}", team="ab"[i % 2], gpus=1 + i % 3)
        run_attempt(store, clock, job.id, ["n1"], 10 + i, S.SUCCEEDED)
    child = subprocess.Popen(
        [sys.executable, "-c", ACCOUNT_IN_BATCHES, state_url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        seen = []
        for _ in range(3):  # three batches committed
            child.stdin.write("go\n")
            child.stdin.flush()
            seen.append(int(child.stdout.readline()))
        child.stdin.write("go\n")  # the fourth is under way, or about to be, when it dies
        child.stdin.flush()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    assert 0 < seen[0] < seen[-1]
    partial = len(usage.lines())
    assert 0 < partial < jobs, "killed part-way through the backlog"
    acct = Accountant(usage, nodes=lambda: [], clock=clock, every_s=0)
    while acct.tick():
        pass
    lines = usage.lines()
    assert sorted(x.job_id for x in lines) == sorted({x.job_id for x in lines})
    assert len(lines) == jobs
    want = sum((1 + i % 3) * (10 + i) * 1000 for i in range(jobs))
    assert sum(x.gpu_ms for x in lines) == want == usage.totals(None)[0].gpu_ms


def test_the_price_list_holds_compute_and_storage_cards_not_token_ones(env):
    from aicluster.store.token_usage import TokenUsageStore

    store, usage, _, clock = env
    ops = UsageOps(usage, store.team_exists)
    usage.set_price("train", None, {"gpu_hour": 2.0}, clock.now)
    usage.set_price(None, None, {"storage_gib_month": 0.02}, clock.now)
    TokenUsageStore(store).set_token_price(None, 0.5, 1.5, clock.now)
    listed = ops.prices(Principal("admin", None, "admin"))["prices"]
    assert [(p["pool"], p["gpu_hour"], p["storage_gib_month"]) for p in listed] == [
        ("train", 2.0, None),
        (None, None, 0.02),
    ]
