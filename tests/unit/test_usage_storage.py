"""Storage samples in the usage ledger, on SQLite and PostgreSQL with a fake clock and a
real local blob store: bytes per team and kind (artifacts, checkpoints, the logs of its
jobs and replicas), one row per day, team and kind however often a day is sampled, the
daily sample taken once a UTC day, and reports of current bytes, GiB-days and their cost
at the storage price in force (which leaves the compute rates as they are)."""

from __future__ import annotations

import pytest

from aicluster.artifacts import parse_ref
from aicluster.control.api_ops import BadRequest
from aicluster.control.logs import LogStore
from aicluster.control.usage import GpuCatalog, UsageOps, rates_at
from aicluster.control.usage_storage import StorageSampler, day_cost_micros
from aicluster.core.replica import ReplicaReason as RR
from aicluster.core.replica import ReplicaStatus as RS
from aicluster.specs.job import JobSpec
from aicluster.specs.service import ServiceSpec
from aicluster.store import open_store
from aicluster.store.artifacts import ArtifactStore
from aicluster.store.artifacts.backend import StorageConfig
from aicluster.store.identity import Principal
from aicluster.store.jobfiles import JobFiles
from aicluster.store.services import ServiceStore
from aicluster.store.usage import UsageStore
from aicluster.store.usage_storage import DAY, StorageSamples

from fakes import FakeClock

GiB = 2**30
ADMIN = Principal("admin", None, "admin")
NOW = 200 * DAY + 3600.0  # 01:00 on day 200


@pytest.fixture
def env(state_url, tmp_path):
    clock = FakeClock(NOW)
    store = open_store(state_url, clock=clock)
    for team in ("a", "b"):
        store.create_team(team)
    repo = ArtifactStore.open(store, tmp_path, StorageConfig(url=str(tmp_path / "blobs")))
    logs = LogStore(tmp_path / "logs")
    samples = StorageSamples(store)
    sampler = StorageSampler(samples, repo, logs.root, clock=clock)
    yield store, repo, logs, samples, sampler, clock
    store.close()


def folder(root, files: dict[str, bytes]):
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def test_bytes_per_team_and_kind(env, tmp_path):
    store, repo, logs, samples, sampler, clock = env
    repo.push_folder(folder(tmp_path / "m", {"w": b"x" * 1000}), parse_ref("a/m"), "model")
    repo.push_folder(folder(tmp_path / "c", {"w": b"y" * 3000}), parse_ref("a/c"), "checkpoint")
    job = store.create_job(JobSpec(name="j", team="b", command="true"), "u")
    logs.append(job.id, 1, 0, b"z" * 500)
    logs.append(job.id, 2, 1, b"z" * 70)
    services = ServiceStore(store)
    svc = services.create(ServiceSpec(name="s", team="a", model="m"), "u")
    rep = services.add_replica(svc)
    services.transition(rep.id, RS.PENDING, RS.STARTING, RR.PLACED, node_id="n")
    logs.append(f"svc-{rep.id}", 1, 0, b"r" * 40)
    logs.append("unknown-abcdef", 1, 0, b"?" * 9)  # no such workload: not counted
    JobFiles(store).append_log(job.id, 3, 0, 0, b"s" * 1000)  # a log kept in the store
    got = sampler.sample()
    assert got[("a", "artifacts")] > 1000 and got[("a", "checkpoints")] > 3000  # + manifests
    assert got[("b", "logs")] == 1570 and got[("a", "logs")] == 40
    assert ("b", "artifacts") not in got
    rows = samples.samples(None, None)
    assert {(r.day, r.team, r.kind): r.bytes for r in rows} == {
        (200, t, k): n for (t, k), n in got.items()
    }


def test_sampling_a_day_again_replaces_its_rows(env, tmp_path):
    store, repo, logs, samples, sampler, clock = env
    job = store.create_job(JobSpec(name="j", team="b", command="true"), "u")
    logs.append(job.id, 1, 0, b"z" * 500)
    sampler.sample()
    sampler.sample()  # again, on demand or after a crash: still one row
    assert [(r.team, r.kind, r.bytes) for r in samples.samples(None, None)] == [("b", "logs", 500)]
    logs.path(job.id, 1, 0).unlink()
    sampler.sample()  # nothing kept any more: the day's row goes
    assert samples.samples(None, None) == []


def test_the_loop_samples_once_a_utc_day(env):
    store, repo, logs, samples, sampler, clock = env
    job = store.create_job(JobSpec(name="j", team="a", command="true"), "u")
    logs.append(job.id, 1, 0, b"z" * 100)
    sampler.tick()
    sampler._running.result(timeout=30)
    assert sampler.done_day == 200
    logs.append(job.id, 1, 0, b"z" * 100)
    clock.advance(3600)
    sampler.tick()  # the same day: no new sample
    assert samples.latest("a")[0].bytes == 100
    clock.advance(DAY)
    sampler.tick()
    sampler._running.result(timeout=30)
    assert [(r.day, r.bytes) for r in samples.samples(None, "a")] == [(200, 100), (201, 200)]
    restarted = StorageSampler(samples, repo, logs.root, clock=clock)
    restarted.tick()  # today is sampled already: a restart does not sample it again
    assert restarted._running is None and restarted.done_day == 201


def test_reports_show_current_bytes_gib_days_and_cost(env):
    store, repo, logs, samples, sampler, clock = env
    usage = UsageStore(store)
    ops = UsageOps(usage, store.team_exists, storage=samples)
    clock.now = 197 * DAY + 1800
    samples.put(197, {("a", "artifacts"): 2 * GiB, ("b", "logs"): GiB})
    clock.now = 198 * DAY + 1800
    samples.put(198, {("a", "artifacts"): 3 * GiB, ("a", "checkpoints"): GiB})
    clock.now = NOW
    with pytest.raises(BadRequest, match="storage_gib_month"):
        ops.set_price(ADMIN, "gpu", None, {"storage_gib_month": 1.0}, None)
    ops.set_price(ADMIN, None, None, {"storage_gib_month": 7.3}, None)  # from now on
    clock.advance(3600)
    samples.put(200, {("a", "artifacts"): 4 * GiB})  # sampled after: priced
    report = ops.report(ADMIN, "3d", None, "team")  # the samples of days 198 to 200
    storage = {g["key"]: g for g in report["storage"]["groups"]}
    a, b = storage["a"], storage["b"]
    assert (a["bytes"], a["artifacts_bytes"], a["sampled_at_day"]) == (4 * GiB, 4 * GiB, 200)
    assert (b["bytes"], b["logs_bytes"], b["gib_days"]) == (GiB, GiB, 0)  # day 197: before
    assert a["gib_days"] == 3 + 1 + 4 and a["days"] == 2
    assert a["cost_micros"] == day_cost_micros(4 * GiB, 7.3) == round(4 * 7.3 * 24 / 730 * 1e6)
    total = report["storage"]["total"]
    for n in ("bytes", "byte_days", "cost_micros"):
        assert total[n] == sum(g[n] for g in report["storage"]["groups"])
    member = ops.report(Principal("m", "b", "member"), "30d", None, "team")
    assert [g["key"] for g in member["storage"]["groups"]] == ["b"]


def test_a_storage_price_leaves_the_compute_rates_in_force(env):
    store, repo, logs, samples, sampler, clock = env
    usage = UsageStore(store)
    usage.set_price(None, None, {"cpu_hour": 0.04}, 0.0)
    usage.set_price(None, None, {"storage_gib_month": 0.02}, 10.0)
    r = rates_at(usage.prices(), None, None, clock(), GpuCatalog())
    assert (r.cpu_hour, r.source) == (0.04, "set")
