"""Two control-plane replicas on one PostgreSQL database: one leads (store.lease), the
other serves the API and takes over when the leader is killed (-9) or paused (SIGSTOP)
past its lease; a paused leader that wakes up leads no more and starts nothing twice.

The replicas get a Ray cluster of their own (a head and one 4-CPU node): the session's
control plane collects every gang its store does not know, and would stop theirs.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter

import httpx
import openai
import pytest
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from aicluster.cli.main import app
from aicluster.engine.protocol import POOL_LABEL
from aicluster.store.db import state_url

from harness import (
    COMMON_NODE_ARGS,
    FAST_NODE_DEATH,
    TERMINAL,
    ControlPlaneProc,
    free_port,
    wait_for,
)

pytestmark = pytest.mark.ray

TTL, RENEW = "2", "0.5"


@pytest.fixture(scope="module")
def mini_ray():
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        connect=False,
        head_node_args=dict(
            num_cpus=0,
            num_gpus=0,
            labels={POOL_LABEL: "system"},
            _system_config=FAST_NODE_DEATH,
            **COMMON_NODE_ARGS,
        ),
    )
    cluster.add_node(num_cpus=4, **COMMON_NODE_ARGS)
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


@pytest.fixture(scope="module")
def replicas(mini_ray, pg_server, tmp_path_factory):
    url = pg_server.create_database()
    home = tmp_path_factory.mktemp("replicas") / "home"
    shared = tmp_path_factory.mktemp("replicas-shared")
    shared.chmod(0o1777)

    def replica(name: str) -> ControlPlaneProc:
        return ControlPlaneProc(
            home,
            mini_ray.address,
            free_port(),
            shared=shared,
            args=("--lease-ttl", TTL, "--lease-renew", RENEW),
            env={"AICLUSTER_STATE": url},
            log_name=f"controlplane-{name}.log",
        )

    a, b = replica("a"), replica("b")
    a.start()
    wait_for(lambda: _view(a)["leader"], timeout=30, what="a leads")
    b.start()
    db = create_engine(state_url(url), pool_pre_ping=True)  # it outlives a DB restart
    yield {"a": a, "b": b, "db": db, "shared": shared, "url": url}
    for cp in (a, b):
        if cp.proc and cp.proc.poll() is None:
            os.killpg(cp.proc.pid, signal.SIGCONT)
            cp.stop()
    db.dispose()


def _view(cp: ControlPlaneProc) -> dict:
    r = httpx.get(cp.url + "/v1/control-plane", headers=_auth(cp), timeout=5)
    r.raise_for_status()
    return r.json()


def _auth(cp: ControlPlaneProc) -> dict:
    return {"Authorization": f"Bearer {cp.admin_token}"}


def _leader_holder(cp: ControlPlaneProc) -> tuple[str, int] | None:
    lead = _view(cp)["leader"]
    return (lead["holder"], lead["epoch"]) if lead and not lead["expired"] else None


def _submit(cp: ControlPlaneProc, shared, prefix: str, n: int) -> list[str]:
    ids = []
    for i in range(n):
        spec = {
            "kind": "job",
            "name": f"{prefix}-{i}",
            "resources": {"cpus": 0.5},
            "command": f"echo $AICLUSTER_JOB_ID >> {shared}/starts; sleep 4; echo done",
        }
        ids.append(cp.client().submit(spec, None)["id"])
    return ids


def _wait_started(cp: ControlPlaneProc, ids: list[str], what: str) -> None:
    """Every job past its launch, so that a takeover adopts it rather than redoing it."""
    started = {"RUNNING", "SUCCEEDED"}
    wait_for(
        lambda: all(cp.client().job(j)["status"] in started for j in ids), timeout=60, what=what
    )


def _all_terminal(cp: ControlPlaneProc, ids: list[str]):
    jobs = [cp.client().job(j) for j in ids]
    return all(j["status"] in TERMINAL for j in jobs) and jobs


def _succeeded_once(db, shared, ids: list[str]) -> None:
    starts = Counter((shared / "starts").read_text().split())
    assert all(starts[j] == 1 for j in ids), {j: starts[j] for j in ids}
    assert {j: 1 for j in ids}.items() <= _transitions_to(db, "SUCCEEDED").items()
    admitted = _transitions_to(db, "ADMITTED")
    assert all(admitted[j] == 1 for j in ids), "each job was admitted once"


def _transitions_to(db, status: str, like: str = "%") -> dict[str, int]:
    """Job id -> how many JobTransition events moved it to `status` (ids LIKE `like`)."""
    with db.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT object_id, count(*) FROM events WHERE type = 'JobTransition' "
                "AND to_status = :status AND object_id LIKE :like GROUP BY object_id"
            ),
            {"status": status, "like": like},
        ).all()
    return dict(rows)


def test_follower_takes_over_from_a_killed_leader(replicas):
    a, b, db, shared = replicas["a"], replicas["b"], replicas["db"], replicas["shared"]
    first = _leader_holder(b)  # the follower answers for the leader too
    assert first is not None and first == _leader_holder(a)
    view = _view(b)
    assert [r["leader"] for r in view["replicas"]].count(True) == 1
    assert len(view["replicas"]) == 2 and all(r["alive"] for r in view["replicas"])
    shown = CliRunner().invoke(app, ["status", "--url", b.url, "--token", b.admin_token])
    assert shown.exit_code == 0, shown.output
    said = " ".join(shown.output.split())
    assert f"leader {first[0]}, epoch {first[1]}" in said
    assert said.count("follower") == 1 and "(* the replica that answered)" in said
    ids = _submit(b, shared, "k", 6)  # through the follower: the leader picks them up
    _wait_started(a, ids, "the jobs running under the first leader")
    killed = time.monotonic()
    a.kill9()
    took = wait_for(
        lambda: (lead := _leader_holder(b)) and lead[1] > first[1] and lead,
        timeout=20,
        interval=0.05,
        what="the follower to lead",
    )
    elapsed = time.monotonic() - killed
    assert took[0] == _view(b)["this"] and elapsed < float(TTL) + 2
    done = wait_for(lambda: _all_terminal(b, ids), timeout=60, what="the jobs to end")
    assert [j["status"] for j in done] == ["SUCCEEDED"] * len(ids), done
    _succeeded_once(db, shared, ids)
    assert "leader_elected" in (a.home / "controlplane-b.log").read_text()


def test_a_paused_leader_is_fenced_and_leads_no_more(replicas):
    a, b, db, shared = replicas["a"], replicas["b"], replicas["db"], replicas["shared"]
    a.start()  # back, as a follower of b
    before = _leader_holder(a)
    assert before is not None and before[0] == _view(b)["this"]
    ids = _submit(a, shared, "s", 6)
    _wait_started(b, ids, "the jobs running under b")
    os.killpg(b.proc.pid, signal.SIGSTOP)
    paused = time.monotonic()
    try:
        took = wait_for(
            lambda: (lead := _leader_holder(a)) and lead[1] > before[1] and lead,
            timeout=20,
            interval=0.05,
            what="a to lead while b is paused",
        )
        assert float(TTL) - 0.5 < time.monotonic() - paused < float(TTL) + 3
        assert took[0] == _view(a)["this"]
        wait_for(lambda: _all_terminal(a, ids), timeout=60, what="the jobs to end under a")
    finally:
        os.killpg(b.proc.pid, signal.SIGCONT)
    log_b = b.home / "controlplane-b.log"
    wait_for(lambda: "leadership_lost" in log_b.read_text(), timeout=15, what="b to know it lost")
    wait_for(
        lambda: f"reconcile loops of epoch {before[1]} stopped" in log_b.read_text(),
        timeout=15,
        what="b's loops to stop",
    )
    assert _leader_holder(b) == took, "b follows a now"
    with db.connect() as conn:
        lost = (
            conn.execute(
                text("SELECT message FROM events WHERE type = 'LeadershipLost' AND object_id = :h"),
                {"h": before[0]},
            )
            .scalars()
            .all()
        )
        epochs = conn.execute(text("SELECT epoch, holder FROM leader_lease")).one()
    # Which of the two a woken lease thread says depends on where the pause caught it:
    # between passes it finds its lease expired; inside a pass (past the expiry check)
    # its renewal is refused because a holds the lease now.
    reasons = ("the lease expired", "another replica holds the lease")
    assert lost and lost[-1].startswith(tuple(f"epoch {before[1]}: {r}" for r in reasons)), lost
    assert tuple(epochs) == (took[1], took[0])
    _succeeded_once(db, shared, ids)
    # b's view of jobs it had running when paused changed nothing after a took over
    with db.connect() as conn:
        late = conn.execute(
            text(
                "SELECT count(*) FROM events WHERE type = 'JobTransition' "
                "AND object_id LIKE 's-%' AND to_status IN ('PENDING', 'FAILED')"
            )
        ).scalar()
    assert late == 0, "no requeue or failure from a stale leader"


def test_a_leader_paused_mid_admission_under_load_starts_nothing_twice(replicas):
    """SIGSTOP of the leader while it admits from a queue deeper than the cluster (14 jobs,
    8 fit), more work submitted to the follower while it is paused and to the old leader
    after SIGCONT: the follower leads, every job SUCCEEDED, each command started once, and
    whatever the paused leader still tried when it woke was fenced (its LeadershipLost
    event counts the stale writes; no job failed)."""
    cps, db, shared = (replicas["a"], replicas["b"]), replicas["db"], replicas["shared"]
    leader = wait_for(lambda: _leader_of(cps), timeout=30, what="a leader")
    follower = cps[1] if leader is cps[0] else cps[0]
    before = _leader_holder(leader)
    ids = _submit(follower, shared, "u", 14)

    def admitting() -> bool:  # jobs running and a queue left: the leader is mid-admission
        statuses = Counter(follower.client().job(j)["status"] for j in ids)
        return statuses["RUNNING"] >= 4 and statuses["PENDING"] >= 1

    wait_for(admitting, timeout=60, interval=0.1, what="the leader admitting from a queue")
    os.killpg(leader.proc.pid, signal.SIGSTOP)
    try:
        ids += _submit(follower, shared, "u-paused", 4)
        took = wait_for(
            lambda: (lead := _leader_holder(follower)) and lead[1] > before[1] and lead,
            timeout=20,
            interval=0.05,
            what="the follower to lead while the leader is paused",
        )
    finally:
        os.killpg(leader.proc.pid, signal.SIGCONT)
    ids += _submit(leader, shared, "u-woken", 4)  # the old leader serves writes as a follower
    done = wait_for(lambda: _all_terminal(follower, ids), timeout=150, what="the 22 jobs to end")
    assert [j["status"] for j in done] == ["SUCCEEDED"] * len(ids), [
        (j["id"], j["status"], j["message"]) for j in done if j["status"] != "SUCCEEDED"
    ]
    starts = Counter((shared / "starts").read_text().split())
    twice = [(j["id"], j.get("attempt"), j["message"]) for j in done if starts[j["id"]] != 1]
    assert {j: starts[j] for j in ids} == {j: 1 for j in ids}, f"started more than once: {twice}"
    assert _leader_holder(leader) == took, "the woken leader follows"
    assert _transitions_to(db, "SUCCEEDED", "u-%") == {j: 1 for j in ids}
    assert _transitions_to(db, "FAILED", "u-%") == {}
    with db.connect() as conn:
        lost = (
            conn.execute(
                text("SELECT message FROM events WHERE type = 'LeadershipLost' AND object_id = :h"),
                {"h": before[0][:96]},
            )
            .scalars()
            .all()
        )
    mine = [m for m in lost if m.startswith(f"epoch {before[1]}: ")]
    assert mine and "stale write(s) rejected so far" in mine[-1], lost


def test_a_database_restarted_under_load_loses_nothing(replicas, pg_server):
    """PostgreSQL crashes and comes back while jobs run and more are submitted: the
    replicas reconnect, a leader leads again, every job runs exactly once, and a request
    that met the outage got a 503 to retry (never a 500)."""
    a, b, db, shared = replicas["a"], replicas["b"], replicas["db"], replicas["shared"]
    before = _leader_holder(b)
    assert before is not None
    ids = _submit(a, shared, "d", 4)
    _wait_started(b, ids, "the jobs running before the restart")
    pg_server.restart()
    statuses, late = [], []

    def submitted() -> bool:  # one try; a 503 is retried, anything else fails the test
        spec = {
            "kind": "job",
            "name": f"d-late-{len(statuses)}",
            "resources": {"cpus": 0.5},
            "command": f"echo $AICLUSTER_JOB_ID >> {shared}/starts; echo done",
        }
        r = httpx.post(a.url + "/v1/jobs", json={"spec": spec}, headers=_auth(a), timeout=10)
        statuses.append(r.status_code)
        assert r.status_code in (201, 503), r.text
        if r.status_code == 201:
            late.append(r.json()["id"])
        return len(late) == 4

    wait_for(submitted, timeout=60, interval=0.25, what="4 submissions through the restart")
    assert len(late) == 4, statuses
    wait_for(lambda: _leader_holder(b), timeout=30, what="a leader after the restart")
    done = wait_for(lambda: _all_terminal(b, ids + late), timeout=90, what="every job to end")
    assert {j["status"] for j in done} == {"SUCCEEDED"}, done
    _succeeded_once(db, shared, ids + late)


def test_forty_jobs_under_ten_leader_kills_each_run_once(replicas):
    """kill -9 of whichever replica leads, at 10 points of a 40-job workload chosen at
    random (seeded), the killed one started again as a follower each time: every job
    SUCCEEDED, and each one's command started exactly once."""
    cps, db, shared = (replicas["a"], replicas["b"]), replicas["db"], replicas["shared"]
    rnd = random.Random(15)
    kill_after = set(rnd.sample(range(2, 38), 10))
    marker = shared / "starts"
    ids, epochs = [], []
    for i in range(40):
        spec = {
            "kind": "job",
            "name": f"x-{i}",
            "resources": {"cpus": 0.5},
            "command": f"echo $AICLUSTER_JOB_ID >> {marker}; sleep {rnd.choice((0, 0.5, 2))}",
        }
        ids.append(_submit_to_any(cps, spec))
        if i in kill_after:
            leader = wait_for(lambda: _leader_of(cps), timeout=30, what="a leader")
            epochs.append(_leader_holder(leader)[1])
            leader.kill9()
            leader.start()
    done = wait_for(lambda: _all_terminal(cps[0], ids), timeout=180, what="the 40 jobs to end")
    assert [j["status"] for j in done] == ["SUCCEEDED"] * len(ids), [
        (j["id"], j["status"], j["message"]) for j in done if j["status"] != "SUCCEEDED"
    ]
    starts = Counter(marker.read_text().split())
    assert {j: starts[j] for j in ids} == {j: 1 for j in ids}, "each command started once"
    assert _transitions_to(db, "SUCCEEDED", "x-%") == {j: 1 for j in ids}
    assert epochs == sorted(set(epochs)) and len(epochs) == 10, "a new term after each kill"


def test_every_replicas_gateway_routes_to_the_services(replicas):
    """A service deployed through one replica answers through the other's gateway too,
    whichever leads: a follower routes from the store's view of READY replicas."""
    cps = (replicas["a"], replicas["b"])
    leader = wait_for(lambda: _leader_of(cps), timeout=30, what="a leader")
    follower = cps[1] if leader is cps[0] else cps[0]
    spec = {
        "kind": "service",
        "name": "everywhere",
        "model": "sim-model",
        "engine": "simulated",
        "resources": {"cpus": 0.5},
        "replicas": {"min": 1, "max": 1},
        "readiness_timeout_s": 60,
    }
    r = httpx.post(follower.url + "/v1/services", json={"spec": spec}, headers=_auth(follower))
    assert r.status_code == 201, r.text

    def answered(cp):
        client = openai.OpenAI(base_url=cp.url + "/v1", api_key=cp.admin_token, max_retries=0)
        try:
            out = client.chat.completions.create(
                model="everywhere", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
        except openai.APIStatusError:
            return None
        return out.choices[0].message.content

    for cp in (leader, follower):
        assert wait_for(lambda cp=cp: answered(cp), timeout=90, what=f"{cp.log_name} to route")
    r = httpx.delete(leader.url + "/v1/services/everywhere", headers=_auth(leader))
    assert r.status_code in (200, 202, 204), r.text


def _leader_of(cps) -> ControlPlaneProc | None:
    """The replica that holds the lease now, as it answers itself."""
    for cp in cps:
        try:
            view = _view(cp)
        except httpx.HTTPError:
            continue
        lead = view["leader"]
        if lead and not lead["expired"] and lead["holder"] == view["this"]:
            return cp
    return None


def _submit_to_any(cps, spec: dict) -> str:
    """Submit on the first replica that answers (a client's fail-over)."""

    def attempt():
        for cp in cps:
            try:
                return cp.client().submit(spec, None)["id"]
            except Exception:  # noqa: BLE001 - down or restarting: the other one
                continue
        return None

    return wait_for(attempt, timeout=30, what=f"a replica to take {spec['name']}")


def test_a_replica_on_another_machine_serves_the_work_any_replica_accepted(
    replicas, mini_ray, tmp_path_factory
):
    """A replica with a home of its own (as on another machine) accepts a job with a
    working directory; whichever replica leads launches it, and the job's log is read
    through the first: both live in the state store, not in a replica's home."""
    from aicluster.client.api import pack_workdir

    a = replicas["a"]
    other = ControlPlaneProc(
        tmp_path_factory.mktemp("machine-c") / "home",
        mini_ray.address,
        free_port(),
        shared=replicas["shared"],
        args=("--lease-ttl", TTL, "--lease-renew", RENEW),
        env={"AICLUSTER_STATE": replicas["url"]},
    )
    other.start()
    try:
        folder = tmp_path_factory.mktemp("project")
        (folder / "data.txt").write_text("carried in the working directory\n")
        spec = {
            "kind": "job",
            "name": "elsewhere",
            "resources": {"cpus": 0.5},
            "command": "cat data.txt; echo $AICLUSTER_JOB_ID",
        }
        c = other.client(token=a.admin_token)
        job = c.submit(spec, pack_workdir(folder))
        done = c.wait(job["id"], TERMINAL, timeout=90)
        assert done["status"] == "SUCCEEDED", done
        for cp in (other, a):
            text = cp.client(token=a.admin_token).logs(job["id"])[0].decode()
            assert text == f"carried in the working directory\n{job['id']}\n"
        assert not (other.home / "workdirs").exists() and not (other.home / "logs").exists()
    finally:
        other.stop()
