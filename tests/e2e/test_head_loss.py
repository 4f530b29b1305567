"""The head machine dies and comes back: with `--ray-gcs-state rocksdb:PATH` Ray's cluster
state outlives it, so a job running on another machine keeps running (the same process)
and finishes as its first attempt; without it (Ray's default) that job is lost.

Runs its own installations (a head and a worker, each an AICLUSTER_HOME under tmp), apart
from the integration session's cluster. The head's loss: every process of its
installation killed with SIGKILL at once (Ray's daemons and the control plane) and its
Ray session files removed, as a new machine would start without them; its home (the
control plane's SQLite state, in production a PostgreSQL elsewhere) and the RocksDB
folder (a volume) are kept.
"""

from __future__ import annotations

import json
import re
import shutil

import psutil
import pytest

from aicluster.engine.rayenv import ray_temp_dir
from aicluster.engine.raynode import installation_processes

from harness import free_port, marked_processes, wait_for
from harness import run_cli as run


def _job(home, name: str) -> dict:
    return json.loads(run(home, "describe", name, "-o", "json").stdout)


def _kill_machine(home) -> int:
    procs = installation_processes(home)
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)
    shutil.rmtree(ray_temp_dir(home), ignore_errors=True)
    return len(procs)


@pytest.fixture
def cluster(tmp_path):
    home, worker_home = tmp_path / "head", tmp_path / "worker"
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # the sandboxed job's user writes here
    gcs = tmp_path / "gcs-volume"
    port = free_port()
    up = [
        *("up", "--head", "--api-port", str(port), "--num-cpus", "0"),
        *("--shared-path", str(shared), "--ray-gcs-state", f"rocksdb:{gcs}"),
    ]
    out = run(home, *up).stdout
    assert f"rocksdb:{gcs}" in out, "up says where the cluster's state is kept"
    ray_address = re.search(r"Ray head:\s+(\S+)", out).group(1)
    try:
        run(
            worker_home,
            *("join", ray_address, "--num-cpus", "2"),
            *("--ray-token-file", str(home / "ray" / "auth_token")),
        )
        yield home, worker_home, shared, ray_address
    finally:
        run(worker_home, "down", check=False)
        run(home, "down", check=False)


def test_a_job_keeps_running_through_the_heads_loss_with_gcs_state_on_a_volume(cluster):
    home, worker_home, shared, ray_address = cluster
    spec = shared / "job.yaml"
    spec.write_text(
        "kind: job\nname: survivor\n"
        f"command: sh -c 'echo started >> {shared}/starts; "
        f"while [ ! -e {shared}/stop ]; do sleep 0.2; done'\n"
    )
    run(home, "submit", str(spec))
    starts = shared / "starts"
    wait_for(lambda: starts.exists() and starts.read_text().strip(), timeout=120, what="the job")
    wait_for(lambda: _job(home, "survivor")["status"] == "RUNNING", timeout=60, what="RUNNING")
    # the job's shell as this node sees it (its own `$$` is of its sandbox's PID namespace)
    pids = [p for p in marked_processes(f"{shared}/stop") if psutil.Process(p).name() == "sh"]
    assert pids, "the job's shell runs on this machine"

    assert _kill_machine(home) > 0
    assert all(map(psutil.pid_exists, pids)), "the job runs on the worker, which lost nothing"
    out = run(home, "up", "--num-cpus", "0").stdout  # the new head: settings remembered
    assert re.search(r"Ray head:\s+(\S+)", out).group(1) == ray_address

    def worker_back():
        nodes = json.loads(run(home, "nodes", "-o", "json").stdout)
        return sum(n["alive"] for n in nodes) == 2

    wait_for(worker_back, timeout=90, what="the worker node in the new head's cluster")
    assert all(map(psutil.pid_exists, pids)), "the job's process outlived the head"
    job = _job(home, "survivor")
    assert job["status"] == "RUNNING" and job["attempt"] == 1

    (shared / "stop").write_text("")
    done = wait_for(
        lambda: (j := _job(home, "survivor"))["status"] in ("SUCCEEDED", "FAILED") and j,
        timeout=90,
        what="the job to end",
    )
    assert done["status"] == "SUCCEEDED" and done["attempt"] == 1, done
    assert starts.read_text().split() == ["started"], "it never ran again"


@pytest.mark.parametrize(
    "value,says",
    [
        ("redis://:secret@127.0.0.1:6379", "password"),
        ("rocksdb:relative/path", "absolute"),
        ("etcd://127.0.0.1:2379", "memory, redis://HOST:PORT or rocksdb"),
    ],
)
def test_a_bad_gcs_state_is_refused_before_anything_starts(tmp_path, value, says):
    home = tmp_path / "h"
    proc = run(home, "up", "--ray-gcs-state", value, check=False, timeout=60)
    assert proc.returncode == 2 and "--ray-gcs-state" in proc.stderr and says in proc.stderr
    assert "secret" not in proc.stderr and "Traceback" not in proc.stderr
    assert not home.exists()
