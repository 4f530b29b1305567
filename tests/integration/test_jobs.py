"""Jobs on a real two-node Ray cluster with declared GPUs, through the real API."""

from __future__ import annotations

import re
import uuid

import psutil

from harness import TERMINAL, marked_processes, wait_for

ENV_LINE = (
    "echo rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK node_rank=$NODE_RANK "
    "cuda=[$CUDA_VISIBLE_DEVICES] node=$AICLUSTER_NODE_ID master=$MASTER_ADDR:$MASTER_PORT"
)


def job_spec(name: str, command, workers: int = 1, gpus: int = 0, **extra) -> dict:
    spec = {
        "kind": "job",
        "name": name,
        "workers": workers,
        "resources": {"cpus": 1, "gpus": gpus},
        "command": command,
    }
    spec.update(extra)
    return spec


def run_to_end(client, spec: dict, timeout: float = 90) -> dict:
    job = client.submit(spec, None)
    return client.wait(job["id"], TERMINAL, timeout=timeout)


def env_of(client, job: dict) -> list[dict]:
    out = []
    for rank in range(job["workers"]):
        text = client.logs(job["id"], rank=rank)[0].decode()
        out.append(dict(re.findall(r"(\w+)=(\S*)", text)))
    return out


def test_gang_spreads_over_two_nodes_with_torchrun_env(admin, gpu_nodes):
    job = run_to_end(admin, job_spec("spread", ENV_LINE, workers=2, gpus=2))
    assert job["status"] == "SUCCEEDED", job
    placement = job["placement"]
    assert len(set(placement)) == 2 and set(placement) <= set(gpu_nodes)
    envs = env_of(admin, job)
    for rank, env in enumerate(envs):
        assert env["rank"] == str(rank) and env["world"] == "2"
        assert env["local"] == "0"
        assert env["node"] == placement[rank], "worker runs on the node the scheduler chose"
        assert env["cuda"] == "[0,1]"
    assert {e["node_rank"] for e in envs} == {"0", "1"}
    assert envs[0]["master"] == envs[1]["master"]


def test_workers_on_one_node_get_distinct_gpus(admin):
    job = run_to_end(admin, job_spec("gpus4", ENV_LINE, workers=4, gpus=1))
    assert job["status"] == "SUCCEEDED", job
    envs = env_of(admin, job)
    by_node: dict[str, list[dict]] = {}
    for env in envs:
        by_node.setdefault(env["node"], []).append(env)
    assert len(by_node) == 2
    for workers in by_node.values():
        assert sorted(w["cuda"] for w in workers) == ["[0]", "[1]"]
        assert sorted(w["local"] for w in workers) == ["0", "1"]
    assert sorted(e["rank"] for e in envs) == ["0", "1", "2", "3"]


def test_cpu_worker_sees_no_gpu(admin):
    job = run_to_end(admin, job_spec("cpuonly", ENV_LINE))
    assert job["status"] == "SUCCEEDED"
    assert env_of(admin, job)[0]["cuda"] == "[]"


def test_failing_command_fails_with_its_exit_code(admin):
    job = run_to_end(admin, job_spec("fails", "echo about to fail; exit 3", workers=2))
    assert job["status"] == "FAILED"
    assert job["reason"] == "exit_code" and job["exit_code"] == 3
    assert "exited with code 3" in job["message"]
    assert b"about to fail" in admin.logs(job["id"], rank=0)[0]
    events = admin.job(job["id"])["events"]
    assert [e["to_status"] for e in events] == ["PENDING", "ADMITTED", "RUNNING", "FAILED"]


def test_cancel_kills_every_worker_and_frees_capacity(admin):
    mark = f"600.{uuid.uuid4().int % 10**9}"  # sleep's argument, unique: how we find them
    cmd = f"(sleep {mark} & wait)"
    job = admin.submit(job_spec("sleeper", cmd, workers=2, gpus=2), None)
    admin.wait(job["id"], {"RUNNING"}, timeout=60)
    sleepers = lambda: [p for p in marked_processes(mark) if _name(p) == "sleep"]
    pids = wait_for(lambda: len(sleepers()) == 2 and sleepers(), what="both workers' sleep")
    pids += marked_processes(mark)  # and the shells around them
    done = admin.cancel(job["id"])
    assert done["status"] == "CANCELLED" and done["reason"] == "cancelled_by_user"
    assert "admin" in done["message"]
    wait_for(lambda: not any(_alive(p) for p in pids), timeout=20, what="workers to die")
    # The whole cluster's GPUs are free again: a job that needs all of them runs.
    again = run_to_end(admin, job_spec("after-cancel", "true", workers=2, gpus=2))
    assert again["status"] == "SUCCEEDED"


def _name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except psutil.NoSuchProcess:
        return ""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_job_larger_than_cluster_stays_pending_with_reason(admin):
    big = admin.submit(job_spec("toobig", "true", workers=3, gpus=2), None)
    waiting = wait_for(lambda: (j := admin.job(big["id"]))["message"] and j, what="a wait reason")
    assert waiting["status"] == "PENDING"
    assert waiting["wait_kind"] == "never_fits"
    assert waiting["message"].startswith("could never fit")
    assert "4 GPU" in waiting["message"]
    # It does not block the queue.
    small = run_to_end(admin, job_spec("small", "true"))
    assert small["status"] == "SUCCEEDED"
    assert admin.job(big["id"])["status"] == "PENDING"
    admin.cancel(big["id"])


def test_never_fitting_job_fails_after_max_pending(admin):
    job = run_to_end(admin, job_spec("hopeless", "true", gpus=8, max_pending_seconds=1))
    assert job["status"] == "FAILED" and job["reason"] == "could_never_fit"


def test_gpu_model_is_honoured(admin):
    ok = run_to_end(
        admin, {**job_spec("a100", "true", gpus=1), "resources": {"gpus": 1, "gpu_model": "a100"}}
    )
    assert ok["status"] == "SUCCEEDED"
    h100 = admin.submit(
        {**job_spec("h100", "true"), "resources": {"gpus": 1, "gpu_model": "H100"}}, None
    )
    j = wait_for(lambda: (x := admin.job(h100["id"]))["message"] and x, what="wait reason")
    assert "GPU model H100" in j["message"] and "could never fit" in j["message"]
    admin.cancel(h100["id"])


def test_logs_stream_while_the_job_runs(admin):
    cmd = "for i in 1 2 3 4 5 6; do echo line-$i; sleep 0.5; done"
    job = admin.submit(job_spec("streamer", cmd), None)
    seen_running = []
    text = b""
    for chunk in admin.follow_logs(job["id"], poll=0.2, timeout=60):
        text += chunk
        seen_running.append(admin.job(job["id"])["status"])
    assert text.decode().split() == [f"line-{i}" for i in range(1, 7)]
    assert "RUNNING" in seen_running, "some lines arrived before the job ended"
    assert admin.job(job["id"])["status"] == "SUCCEEDED"


def test_working_dir_is_uploaded_with_the_job(admin, tmp_path):
    code = tmp_path / "project" / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "pkg" / "data.txt").write_text("payload-42\n")
    (code / "__pycache__").mkdir()
    (code / "__pycache__" / "junk.pyc").write_bytes(b"x")
    spec = tmp_path / "project" / "job.yaml"
    spec.write_text(
        "kind: job\nname: wd\nworkers: 2\nworking_dir: code\ncommand: cat pkg/data.txt && ls -a\n"
    )
    job = admin.submit_file(spec)
    done = admin.wait(job["id"], TERMINAL, timeout=60)
    assert done["status"] == "SUCCEEDED", done
    for rank in range(2):
        out = admin.logs(job["id"], rank=rank)[0].decode()
        assert "payload-42" in out and "__pycache__" not in out
