"""Bounds on the workers' logs kept in the state store (control.logs.SharedLogStore over
store.jobfiles), on SQLite and PostgreSQL: the log cap keeps a rank's newest bytes and a
read shows what it dropped as one marker line; the logs retention deletes the logs of jobs
that ended longer ago, in small transactions, once, with a LogsRemoved event; the API
answers 410 for them and `aicluster logs` says so; the control plane's flags refuse bad
values naming the flag."""

from __future__ import annotations

import httpx
import pytest
from typer.testing import CliRunner

from aicluster.api.app import create_app
from aicluster.api.server import main as controlplane_main
from aicluster.cli.main import app as cli
from aicluster.control.api_ops import ApiOps
from aicluster.control.logs import SharedLogStore, dropped_marker
from aicluster.core.lifecycle import JobStatus, Reason
from aicluster.specs.job import JobSpec
from aicluster.store import open_store
from aicluster.store.jobfiles import LOGS_REMOVED, JobFiles

from asgi_server import serving
from fakes import FakeClock

DAY = 86400.0


@pytest.fixture
def world(state_url):
    clock = FakeClock()
    store = open_store(state_url, clock=clock)
    store.create_team("default")
    yield store, clock
    store.close()


def _ended_job(store, name: str) -> str:
    job = store.create_job(JobSpec(name=name, command="true"), "admin")
    assert store.transition(
        job.id, JobStatus.PENDING, JobStatus.CANCELLED, Reason.CANCELLED_BY_USER, "no"
    )
    return job.id


def _removed_events(store, job_id: str) -> list:
    return [e for e in store.list_events(object_id=job_id) if e.type == LOGS_REMOVED]


def test_the_cap_keeps_the_newest_bytes_and_a_read_says_what_it_dropped(world):
    store, _ = world
    logs = SharedLogStore(JobFiles(store), cap_bytes=100)
    worker = b"".join(b"line %03d ...\n" % i for i in range(20))  # 14 bytes a line
    for at in range(0, len(worker), 42):  # pulls of three lines
        logs.append("j", 1, 0, worker[at : at + 42], at=at)
    assert logs.offset("j", 1, 0) == len(worker)  # the next pull starts where it did
    data, nxt = logs.read_from("j", 1, 0)
    first_line = data.split(b"\n", 1)[0]  # counts the bytes before the first chunk kept
    dropped = int(first_line.split()[1])
    assert first_line == b"... %d bytes dropped ..." % dropped
    assert data == dropped_marker(dropped) + worker[dropped:] and nxt == len(worker)
    assert 100 <= len(worker) - dropped < 100 + 42  # whole chunks: at most one pull more
    # a reader past the dropped part sees no marker; one at the end reads nothing
    assert logs.read_from("j", 1, 0, offset=dropped + 5) == (worker[dropped + 5 :], len(worker))
    assert logs.read_from("j", 1, 0, offset=len(worker)) == (b"", len(worker))
    # a small limit still moves the reader forward past the marker
    data, nxt = logs.read_from("j", 1, 0, offset=3, limit=10)
    assert data == dropped_marker(dropped - 3) + worker[dropped : dropped + 10]
    assert nxt == dropped + 10
    # another log of the same job is untouched by this one's cap
    logs.append("j", 1, 1, b"rank 1\n", at=0)
    assert logs.read("j", 1, 1) == b"rank 1\n"


def test_ended_jobs_logs_are_deleted_after_the_retention_in_small_batches(world):
    store, clock = world
    logs = SharedLogStore(
        JobFiles(store), retention_s=30 * DAY, collect_every_s=60, collect_batch=10
    )
    old = _ended_job(store, "old")
    for attempt, rank in ((1, 0), (1, 1), (2, 0)):
        for i in range(12):  # 36 chunks in all
            logs.append(old, attempt, rank, b"chunk %d\n" % i)
    clock.advance(10 * DAY)
    recent = _ended_job(store, "recent")
    running = store.create_job(JobSpec(name="running", command="sleep 1"), "admin").id
    for job in (recent, running):
        logs.append(job, 1, 0, b"kept\n")
    clock.advance(25 * DAY)  # `old` ended 35 days ago, `recent` 25

    assert logs.collect(max_batches=1) == 10  # one transaction: at most a batch
    assert not _removed_events(store, old)  # not all gone yet
    assert logs.collect(max_batches=10, budget_s=60) == 26  # the rest, then no more
    assert logs.attempts(old) == [] and logs.read(old, 2, 0) == b""
    assert logs.read(recent, 1, 0) == b"kept\n" and logs.read(running, 1, 0) == b"kept\n"
    [event] = _removed_events(store, old)
    assert event.message == "the job ended more than 30 days ago (logs retention)"
    assert logs.removed(old) == event.message and logs.removed(recent) is None

    logs.append(running, 1, 0, b"more\n")
    clock.advance(30)
    assert logs.collect() == 0  # not due again within collect_every_s
    clock.advance(60)
    assert logs.collect() == 0 and len(_removed_events(store, old)) == 1
    assert logs.read(running, 1, 0) == b"kept\nmore\n"
    clock.advance(10 * DAY)  # `recent` is now past the retention too
    assert logs.collect() == 1 and logs.removed(recent)


def test_without_retention_nothing_is_collected(world):
    store, clock = world
    logs = SharedLogStore(JobFiles(store))
    job = _ended_job(store, "kept")
    logs.append(job, 1, 0, b"for ever\n")
    clock.advance(10_000 * DAY)
    assert logs.collect() == 0 and logs.read(job, 1, 0) == b"for ever\n"


def test_the_api_and_cli_say_a_jobs_logs_were_removed_or_capped(world, tmp_path):
    store, clock = world
    store.create_user("admin", None, "admin")
    token = store.create_token("admin")
    logs = SharedLogStore(JobFiles(store), cap_bytes=64, retention_s=DAY, collect_batch=2)
    gone = _ended_job(store, "gone")
    logs.append(gone, 1, 0, b"bye\n")
    capped = store.create_job(JobSpec(name="capped", command="yes"), "admin").id
    worker = b"y\n" * 200
    for at in range(0, len(worker), 50):
        logs.append(capped, 0, 0, worker[at : at + 50], at=at)
    clock.advance(2 * DAY)
    assert logs.collect() == 1

    api = ApiOps(store, engine=None, logs=logs, workdirs=tmp_path)
    with serving(create_app(api)) as url:
        auth = {"Authorization": f"Bearer {token}"}
        r = httpx.get(f"{url}/v1/jobs/{gone}/logs", headers=auth)
        assert r.status_code == 410, r.text
        said = r.json()["detail"]["message"]
        assert (
            said
            == f"the logs of job {gone} were removed: the job ended more than 1 day ago (logs retention)"
        )
        r = httpx.get(f"{url}/v1/jobs/{capped}/logs", headers=auth)
        assert r.status_code == 200 and r.content.startswith(b"... ")
        assert int(r.headers["X-Next-Offset"]) == len(worker)

        run = CliRunner().invoke(cli, ["logs", gone, "--url", url, "--token", token])
        assert run.exit_code == 1
        assert "were removed: the job ended more than 1 day ago" in " ".join(run.output.split())
        run = CliRunner().invoke(cli, ["logs", capped, "--url", url, "--token", token])
        assert run.exit_code == 0, run.output
        dropped = int(run.output.split()[1])
        assert run.output == dropped_marker(dropped).decode() + worker[dropped:].decode()


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--logs-retention", "soon", "argument --logs-retention: logs retention"),
        ("--log-cap", "big", "argument --log-cap: invalid log cap size 'big'"),
    ],
)
def test_bad_retention_flags_are_refused_naming_the_flag(capsys, tmp_path, flag, value, said):
    with pytest.raises(SystemExit) as exit_:
        controlplane_main(["--home", str(tmp_path), "--ray-address", "127.0.0.1:1", flag, value])
    assert exit_.value.code == 2
    assert said in capsys.readouterr().err
