"""Reports by team read the per-team daily sums (store.usage): on SQLite and PostgreSQL they
give exactly the integers that summing every line gives, for windows that start mid-day,
with a team or without; a report's total is the sum of its groups; and migrating a store
that already holds daily sums fills the per-team ones from them."""

from __future__ import annotations

import random

import pytest
from sqlalchemy import insert, select

from aicluster.control.usage import UsageOps
from aicluster.store import open_store
from aicluster.store.db import make_engine, migrate
from aicluster.store.identity import Principal
from aicluster.store.usage import DAY, SUMS, UsageStore, grand_total
from aicluster.store.usage_schema import UsageDailyRow, UsageTeamDailyRow

from fakes import FakeClock

NOW = 100 * DAY + 7 * 3600.0  # 07:00 on day 100


def line(i: int, rnd: random.Random) -> dict:
    team = f"t{rnd.randrange(3)}"
    run_ms = rnd.randrange(1000, 10**7)
    gpus = rnd.choice((0, 1, 8))
    return dict(
        job_id=f"j{i}",
        attempt=1,
        team=team,
        user=f"{team}-u{rnd.randrange(3)}",
        pool=rnd.choice(("a", "b", None)),
        gpu_model=rnd.choice(("H100", None)),
        nodes=["n"],
        workers=1,
        gpus=gpus,
        cpus=2.0,
        memory=2**30,
        admitted_at=0.0,
        started_at=0.0,
        ended_at=NOW - rnd.random() * 9 * DAY,
        end_reason=rnd.choice(("completed", "preempted", "node_lost", "exit_code")),
        run_ms=run_ms,
        gpu_ms=gpus * run_ms,
        cpu_ms=2 * run_ms,
        memory_gib_ms=run_ms,
        gpu_hour=1.0,
        cpu_hour=0.0,
        memory_gib_hour=0.0,
        price_source="set",
        cost_micros=gpus * run_ms // 3600,
        accounted_at=NOW,
    )


@pytest.fixture
def usage(state_url):
    store = open_store(state_url, clock=FakeClock(NOW))
    for team in ("t0", "t1", "t2"):
        store.create_team(team)
    u = UsageStore(store)
    rnd = random.Random(7)
    u.add_lines(line(i, rnd) for i in range(300))
    u.add_lines(line(i, rnd) for i in range(300, 400))  # adds to existing sum rows
    yield u
    store.close()


def test_team_sums_equal_the_lines(usage):
    far = NOW + DAY
    for since in (None, NOW - 3.5 * DAY, NOW - 8 * DAY - 1234.5, NOW - 3600):
        for team in (None, "t1"):
            for by in (None, "team", "user", "pool"):
                fast = usage.totals(by, since, None, team)
                slow = usage.totals(by, since, far, team)  # every line read
                assert fast == slow, (since, team, by)
                if by is not None:
                    (total,) = usage.totals(None, since, None, team)
                    assert grand_total(fast) == total


def test_team_sums_are_kept_per_day_and_team(usage):
    with usage._session() as s:
        rows = s.scalars(select(UsageTeamDailyRow)).all()
    assert len({(r.day, r.team) for r in rows}) == len(rows)
    assert sum(r.lines for r in rows) == 400


def test_a_report_is_one_pass_with_its_total(usage):
    ops = UsageOps(usage, usage.store.team_exists)
    report = ops.report(Principal("admin", None, "admin"), "5d", None, "team")
    assert report["total"]["lines"] == sum(g["lines"] for g in report["groups"]) > 0
    for n in SUMS:
        assert report["total"][n] == sum(g[n] for g in report["groups"])


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request, tmp_path) -> str:
    """An empty database (state_url's PostgreSQL one comes migrated already)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'e.db'}"
    return request.getfixturevalue("pg_url")


def test_migration_fills_team_sums_from_the_daily_sums(empty_url):
    engine = make_engine(empty_url)
    try:
        migrate(engine, "0021_audit_log")
        fine = [("t0", "u1", "a", "H100"), ("t0", "u2", "", ""), ("t1", "u1", "b", "")]
        with engine.begin() as conn:
            for day in (99, 100):
                for k, (team, user, pool, model) in enumerate(fine):
                    sums = {n: (day * 10 + k) * (i + 1) for i, n in enumerate(SUMS)}
                    conn.execute(
                        insert(UsageDailyRow.__table__).values(
                            day=day, team=team, user=user, pool=pool, gpu_model=model, **sums
                        )
                    )
        migrate(engine)
        with engine.connect() as conn:
            got = {
                (r.day, r.team): [getattr(r, n) for n in SUMS]
                for r in conn.execute(select(UsageTeamDailyRow.__table__))
            }
    finally:
        engine.dispose()
    for day in (99, 100):
        t0 = (day * 10) + (day * 10 + 1)
        assert got[(day, "t0")] == [t0 * (i + 1) for i in range(len(SUMS))]
        assert got[(day, "t1")] == [(day * 10 + 2) * (i + 1) for i in range(len(SUMS))]
    assert len(got) == 4
