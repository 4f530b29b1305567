"""Usage over time (control.usage_series, store.usage_series, control.usage_metrics) on a
real SQLite store: GPU-hours and cost per team per day are the ledger's exact sums,
queue waits come from the jobs' transitions (submission or requeue to admission), members
see their own team only, bad input names the field, and the Prometheus series say the
same numbers."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from aicluster.control.api_ops import BadRequest, NotFoundError
from aicluster.control.usage_metrics import UsageCollector
from aicluster.control.usage_series import UsageSeriesOps
from aicluster.core.lifecycle import JobStatus, Reason, RequeueCause
from aicluster.specs.job import JobSpec
from aicluster.store import open_store
from aicluster.store.identity import Principal
from aicluster.store.usage import DAY, UsageStore
from aicluster.store.usage_series import UsageSeriesStore

from fakes import FakeClock

NOW = 100 * DAY + 7 * 3600.0  # 07:00 on day 100
ADMIN = Principal("root", None, "admin")
ANN = Principal("ann", "a", "member")


def line(i: int, team: str, ended_at: float, gpu_ms: int, cost_micros: int) -> dict:
    return dict(
        job_id=f"j{i}",
        attempt=1,
        team=team,
        user="u",
        pool="p",
        gpu_model="H100",
        nodes=["n"],
        workers=1,
        gpus=1,
        cpus=1.0,
        memory=2**30,
        admitted_at=ended_at - 10,
        started_at=ended_at - 10,
        ended_at=ended_at,
        end_reason="completed",
        run_ms=gpu_ms,
        gpu_ms=gpu_ms,
        cpu_ms=gpu_ms,
        memory_gib_ms=gpu_ms,
        gpu_hour=1.0,
        cpu_hour=0.0,
        memory_gib_hour=0.0,
        price_source="set",
        cost_micros=cost_micros,
        accounted_at=ended_at,
    )


@pytest.fixture
def world(tmp_path):
    clock = FakeClock(NOW - 3 * DAY)
    store = open_store(tmp_path / "s.db", clock=clock)
    for team in ("a", "b"):
        store.create_team(team)
    UsageStore(store).add_lines(
        [
            line(1, "a", NOW - 2 * DAY, 3_600_000, 2_500_000),  # day 98
            line(2, "a", NOW - 2 * DAY + 60, 1_800_000, 1_250_000),
            line(3, "b", NOW - 1 * DAY, 7_200_000, 5_000_000),  # day 99
            line(4, "a", NOW - 60, 360_000, 250_000),  # day 100
        ]
    )
    # Queue waits: a's job waits 30 s, is requeued, waits 90 s more; b's waits 600 s.
    ja = store.create_job(JobSpec(name="ja", team="a", command="true"), "ann")
    jb = store.create_job(JobSpec(name="jb", team="b", command="true"), "bob")
    clock.advance(30)
    store.transition(ja.id, JobStatus.PENDING, JobStatus.ADMITTED, Reason.ADMITTED)
    clock.advance(10)
    store.transition(
        ja.id,
        JobStatus.ADMITTED,
        JobStatus.PENDING,
        Reason.REQUEUED,
        requeue_cause=RequeueCause.PREEMPTED,
    )
    clock.advance(90)
    store.transition(ja.id, JobStatus.PENDING, JobStatus.ADMITTED, Reason.ADMITTED)
    clock.advance(470)
    store.transition(jb.id, JobStatus.PENDING, JobStatus.ADMITTED, Reason.ADMITTED)
    clock.now = NOW
    series = UsageSeriesStore(store)
    return UsageSeriesOps(series, store.team_exists), series


def points(answer: dict) -> dict[str, list]:
    return {s["team"]: [v for _, v in s["points"]] for s in answer["series"]}


def test_gpu_hours_and_cost_per_team_per_day_are_the_ledgers_sums(world):
    ops, _ = world
    got = ops.series(ADMIN, "3d", "1d", "gpu_hours", None)
    assert got["buckets"] == [97 * DAY, 98 * DAY, 99 * DAY, 100 * DAY]
    assert got["step_s"] == DAY and got["until"] == NOW
    assert points(got) == {"a": [0, 1.5, 0, 0.1], "b": [0, 0, 2.0, 0]}
    cost = ops.series(ADMIN, "3d", "1d", "cost_usd", None)
    assert points(cost) == {"a": [0, 3.75, 0, 0.25], "b": [0, 0, 5.0, 0]}
    assert {s["team"]: s["total"] for s in cost["series"]} == {"a": 4.0, "b": 5.0}
    weekly = ops.series(ADMIN, "3d", "7d", "gpu_hours", "b")
    assert weekly["team"] == "b" and [s["total"] for s in weekly["series"]] == [2.0]


def test_queue_wait_is_the_mean_and_max_from_pending_to_admission(world):
    ops, _ = world
    got = ops.series(ADMIN, "4d", "1d", "queue_wait_s", None)
    by_team = {s["team"]: s for s in got["series"]}
    assert (by_team["a"]["total"], by_team["a"]["max_s"], by_team["a"]["count"]) == (60, 90, 2)
    assert (by_team["b"]["total"], by_team["b"]["count"]) == (600, 1)
    day97 = got["buckets"].index(97 * DAY)
    assert by_team["a"]["points"][day97][1] == 60 and by_team["a"]["max"][day97][1] == 90
    assert by_team["a"]["points"][day97 + 1][1] is None  # no admissions that day


def test_members_see_their_own_team_only(world):
    ops, _ = world
    assert list(points(ops.series(ANN, "3d", "1d", "gpu_hours", None))) == ["a"]
    assert list(points(ops.series(ANN, "4d", "1h", "queue_wait_s", "a"))) == ["a"]
    with pytest.raises(NotFoundError):
        ops.series(ANN, "3d", "1d", "gpu_hours", "b")
    with pytest.raises(NotFoundError):
        ops.series(ADMIN, "3d", "1d", "gpu_hours", "nobody")


@pytest.mark.parametrize(
    "since,step,metric,field",
    [
        ("3d", "1d", "watts", "metric"),
        ("3x", "1d", "gpu_hours", "since"),
        ("3d", "soon", "gpu_hours", "step"),
        ("3d", "6h", "cost_usd", "step"),  # the ledger's sums are daily
        ("30d", "1m", "queue_wait_s", "step"),  # 43201 buckets
        ("3d", "1s", "queue_wait_s", "step"),
    ],
)
def test_bad_input_names_the_field(world, since, step, metric, field):
    ops, _ = world
    with pytest.raises(BadRequest) as exc:
        ops.series(ADMIN, since, step, metric, None)
    assert exc.value.field == field


def test_prometheus_series_say_the_same_numbers(world):
    _, series = world
    registry = CollectorRegistry()
    registry.register(UsageCollector(series, backfill_s=7 * DAY))
    text = generate_latest(registry).decode()
    assert 'aicluster_usage_gpu_seconds_total{team="a"} 5760.0' in text
    assert 'aicluster_usage_cost_usd_total{team="b"} 5.0' in text
    assert 'aicluster_queue_wait_seconds_count{team="a"} 2.0' in text
    assert 'aicluster_queue_wait_seconds_sum{team="a"} 120.0' in text
    # A second scrape reads on from its cursor: nothing is observed twice.
    text = generate_latest(registry).decode()
    assert 'aicluster_queue_wait_seconds_count{team="b"} 1.0' in text
