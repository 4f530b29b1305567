"""Replica runs in the usage ledger, on SQLite and PostgreSQL with a fake clock: one line
per run from its placement to its end, GPU/CPU/memory time to the second, a line even
after its service is deleted, none for a replica that never got a node, node loss and
preemption attributed as lost (a drain is not), idempotent accounting (kill mid-way,
account twice, a lost cursor), reports by service, kind and team that reconcile, and a
migration that keeps the replicas placed at the upgrade."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy import select

from aicluster.control.usage import Accountant, UsageOps
from aicluster.core.lifecycle import JobStatus as S
from aicluster.core.lifecycle import Reason
from aicluster.core.replica import ReplicaReason as RR
from aicluster.core.replica import ReplicaStatus as RS
from aicluster.specs.job import JobSpec
from aicluster.specs.service import ServiceSpec
from aicluster.store import open_store
from aicluster.store.db import make_engine, migrate
from aicluster.store.identity import Principal
from aicluster.store.services import ServiceStore
from aicluster.store.usage import SUMS, UsageStore, grand_total
from aicluster.store.usage_schema import UsageReplicaRunRow, UsageServiceDailyRow

from fakes import FakeClock, node

GiB = 2**30
NODES = [
    node("g1", gpus=8, pool="serve", gpu_model="L40S"),
    node("c1", gpus=0, pool="cpu"),
]
ADMIN = Principal("admin", None, "admin")


@pytest.fixture
def env(state_url):
    clock = FakeClock()
    store = open_store(state_url, clock=clock)
    for team in ("a", "b"):
        store.create_team(team)
    usage = UsageStore(store)
    usage.set_price(None, None, {"gpu_hour": 2.0, "cpu_hour": 0.1}, 0.0)
    acct = Accountant(usage, nodes=lambda: NODES, clock=clock, every_s=0)
    yield store, ServiceStore(store), usage, acct, clock
    store.close()


def deploy(services, name, team="a", gpus=1, cpus=4.0, memory=8 * GiB, owner="alice"):
    spec = ServiceSpec(
        name=name,
        team=team,
        model="m",
        engine="simulated",
        resources={"gpus": gpus, "cpus": cpus, "memory": memory},
    )
    return services.create(spec, owner)


def run(services, clock, svc, node_id, seconds, end=RS.STOPPED, reason=RR.SCALED_DOWN):
    """A replica placed on `node_id`, READY after 5 s, ended `seconds` after placement."""
    rep = services.add_replica(svc)
    clock.advance(11)  # waiting for the scheduler: not held, not counted
    services.transition(rep.id, RS.PENDING, RS.STARTING, RR.PLACED, node_id=node_id)
    clock.advance(5)
    services.transition(rep.id, RS.STARTING, RS.READY, RR.HEALTHY)
    clock.advance(seconds - 5)
    services.transition(rep.id, RS.READY, end, reason)
    return rep


def test_a_replica_line_covers_placement_to_stop(env):
    store, services, usage, acct, clock = env
    svc = deploy(services, "chat", gpus=2)
    rep = run(services, clock, svc, "g1", 600)
    assert acct.tick() == 1
    (line,) = usage.lines()
    assert (line.kind, line.service, line.job_id, line.attempt) == (
        "replica",
        "chat",
        f"replica:{rep.id}",
        1,
    )
    assert (line.team, line.user, line.pool, line.gpu_model) == ("a", "alice", "serve", "L40S")
    assert line.nodes == ["g1"] and line.gpus == 2 and line.end_reason == "scaled_down"
    assert line.ended_at - line.started_at == 600
    assert (line.run_ms, line.gpu_ms, line.cpu_ms) == (600_000, 2 * 600_000, 4 * 600_000)
    assert line.memory_gib_ms == 8 * 600_000
    # 2 GPU x 600 s at 2.0/h + 4 CPU x 600 s at 0.1/h, in micro-units
    assert line.cost_micros == round((1200 * 2.0 + 2400 * 0.1) / 3600 * 1e6)


def test_a_deleted_service_still_gets_its_lines_and_pending_replicas_none(env):
    store, services, usage, acct, clock = env
    svc = deploy(services, "gone", cpus=1.0, gpus=0)
    placed = services.add_replica(svc)
    services.transition(placed.id, RS.PENDING, RS.STARTING, RR.PLACED, node_id="c1")
    never = services.add_replica(svc)
    clock.advance(90)
    services.transition(placed.id, RS.STARTING, RS.STOPPED, RR.DELETED)
    services.transition(never.id, RS.PENDING, RS.STOPPED, RR.DELETED)
    services.remove(svc.seq)  # the service and replica rows are gone before accounting
    assert acct.tick() == 1
    (line,) = usage.lines()
    assert line.job_id == f"replica:{placed.id}" and line.end_reason == "deleted"
    assert (line.pool, line.gpu_model, line.cpu_ms, line.gpu_ms) == ("cpu", None, 90_000, 0)


def test_node_loss_and_preemption_are_lost_work_a_drain_is_not(env):
    store, services, usage, acct, clock = env
    svc = deploy(services, "llm", gpus=1)
    run(services, clock, svc, "g1", 100, RS.FAILED, RR.NODE_LOST)
    run(services, clock, svc, "g1", 200, RS.STOPPED, RR.PREEMPTED)
    run(services, clock, svc, "g1", 400, RS.STOPPED, RR.NODE_DRAINED)
    run(services, clock, svc, "g1", 800, RS.FAILED, RR.ENGINE_EXITED)
    assert acct.tick() == 4
    (total,) = usage.totals(None)
    assert total.gpu_ms == 1500_000 and total.lost_gpu_ms == 300_000
    (slow,) = usage.totals(None, 0.0, clock() + 1)  # from the lines, not the daily sums
    assert slow == total


def test_accounting_is_idempotent_under_a_kill_and_a_lost_cursor(env):
    store, services, usage, acct, clock = env
    svc = deploy(services, "s")
    for _ in range(3):
        run(services, clock, svc, "g1", 60)
    calls = []

    def crashing(run_, end, prices):
        calls.append(run_.replica_id)
        if len(calls) == 2:
            raise SystemExit("kill -9")  # the process dies mid-transaction
        return acct.replica_line(run_, end, prices)

    with pytest.raises(SystemExit):
        usage.account(acct.line, 2000, crashing)
    assert usage.lines() == [] and usage.cursor() == 0
    assert acct.tick() == 3 and acct.tick() == 0
    with store.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE usage_cursor SET event_id = 0")
    assert acct.step() == 0  # from scratch: the key keeps each run one line
    (total,) = usage.totals(None)
    assert total.lines == 3 and total.gpu_ms == 3 * 60_000


def test_one_step_at_a_time_leaves_no_gap(env):
    store, services, usage, acct, clock = env
    svc = deploy(services, "s")
    for _ in range(4):
        run(services, clock, svc, "g1", 30)
    acct.batch = 3  # a few events a step: ends fall in different steps
    while acct.step() or usage.cursor() < max(e.id for e in store.list_events()):
        pass
    assert len(usage.lines()) == 4


def test_reports_by_service_kind_and_team_reconcile(env):
    store, services, usage, acct, clock = env
    chat, embed = deploy(services, "chat", gpus=1), deploy(services, "embed", team="b", gpus=0)
    job = store.create_job(
        JobSpec(name="train", team="a", resources={"gpus": 4}, command="true"), "bob"
    )
    store.transition(job.id, S.PENDING, S.ADMITTED, Reason.ADMITTED, attempt=1, placement=["g1"])
    store.transition(job.id, S.ADMITTED, S.RUNNING, Reason.STARTED)
    for day in range(3):
        run(services, clock, chat, "g1", 3600 + day)
        run(services, clock, embed, "c1", 1800)
        clock.advance(86400 / 2)
    store.transition(job.id, S.RUNNING, S.SUCCEEDED, Reason.COMPLETED)
    acct.tick()
    ops = UsageOps(usage, store.team_exists)
    far = clock() + 1
    for since in (None, clock() - 1.2 * 86400):
        for by in ("service", "kind", "team", "user", "pool", "gpu_model", "job"):
            fast = usage.totals(by, since)
            assert fast == usage.totals(by, since, far), by  # daily sums == every line
            assert grand_total(fast) == usage.totals(None, since)[0], by
    by_service = {g.key: g for g in usage.totals("service")}
    assert set(by_service) == {"chat", "embed", None}  # None: the job's line
    assert by_service["chat"].lines == 3
    assert by_service["chat"].gpu_ms == (3 * 3600 + 0 + 1 + 2) * 1000
    by_kind = {g.key: g.lines for g in usage.totals("kind")}
    assert by_kind == {"replica": 6, "job": 1}
    report = ops.report(ADMIN, "30d", None, "team")
    lines = usage.lines()
    for n in SUMS:
        assert report["total"][n] == sum(g[n] for g in report["groups"])
    for n in ("run_ms", "gpu_ms", "cpu_ms", "memory_gib_ms", "cost_micros"):
        assert report["total"][n] == sum(getattr(x, n) for x in lines)
    assert report["total"]["lines"] == len(lines) == 7
    member = Principal("m", "b", "member")
    mine = ops.report(member, "30d", None, "service")
    assert [g["key"] for g in mine["groups"]] == ["embed"]


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request, tmp_path) -> str:
    """An empty database (state_url's PostgreSQL one comes migrated already)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'e.db'}"
    return request.getfixturevalue("pg_url")


def test_migration_fills_service_sums_and_the_runs_of_placed_replicas(empty_url):
    engine = make_engine(empty_url)
    try:
        migrate(engine, "0023_team_budgets")
        meta = sa.MetaData()
        meta.reflect(engine, only=("teams", "services", "replicas", "events", "usage_team_daily"))
        T = meta.tables
        spec = ServiceSpec(name="chat", team="a", model="m", resources={"gpus": 2, "cpus": 3})
        with engine.begin() as conn:
            conn.execute(T["teams"].insert().values(name="a", created_at=0.0))
            sums = {n: i + 1 for i, n in enumerate(SUMS)}
            conn.execute(T["usage_team_daily"].insert().values(day=9, team="a", **sums))
            seq = conn.execute(
                T["services"]
                .insert()
                .values(
                    name="chat",
                    team="a",
                    owner="alice",
                    spec=spec.model_dump(mode="json"),
                    deleting=False,
                    created_at=0.0,
                    updated_at=0.0,
                )
                .returning(T["services"].c.seq)
            ).scalar_one()
            for rid, status in (("chat-1", "READY"), ("chat-2", "PENDING")):
                conn.execute(
                    T["replicas"]
                    .insert()
                    .values(
                        id=rid,
                        service_seq=seq,
                        team="a",
                        status=status,
                        node_id="g1" if status == "READY" else None,
                        created_at=1.0,
                    )
                )
            conn.execute(
                T["events"]
                .insert()
                .values(
                    ts=42.0,
                    kind="replica",
                    object_id="chat-1",
                    team="a",
                    type="ReplicaTransition",
                    from_status="PENDING",
                    to_status="STARTING",
                )
            )
        migrate(engine)
        with engine.connect() as conn:
            (service_sums,) = conn.execute(select(UsageServiceDailyRow.__table__)).all()
            runs = conn.execute(select(UsageReplicaRunRow.__table__)).all()
    finally:
        engine.dispose()
    assert (service_sums.day, service_sums.team, service_sums.service) == (9, "a", "")
    assert [getattr(service_sums, n) for n in SUMS] == list(range(1, len(SUMS) + 1))
    (run_,) = runs
    assert (run_.replica_id, run_.service, run_.user, run_.node_id) == (
        "chat-1",
        "chat",
        "alice",
        "g1",
    )
    assert (run_.gpus, run_.cpus, run_.placed_at) == (2, 3.0, 42.0)
