"""The CLI as a user runs it: up, join, submit the DDP example, inspect, cancel, down.

Runs its own installation (AICLUSTER_HOME under tmp) with its own Ray head, apart
from the integration session's cluster.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from aicluster.engine.rayenv import ray_temp_dir
from aicluster.engine.raynode import installation_processes

from harness import free_port, wait_for
from harness import run_cli as run


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    home = tmp_path_factory.mktemp("head")
    worker_home = tmp_path_factory.mktemp("worker")
    port = free_port()
    out = run(home, "up", "--head", "--api-port", str(port), "--num-cpus", "4").stdout
    assert f"http://127.0.0.1:{port}" in out
    try:
        yield home, worker_home, out
    finally:
        run(worker_home, "down", check=False)
        run(home, "down", check=False)


def test_join_adds_a_labelled_node(platform):
    home, worker_home, up_out = platform
    ray_address = re.search(r"Ray head:\s+(\S+)", up_out).group(1)
    token_file = home / "ray" / "auth_token"
    # An attempt killed with this machine's previous incarnation left its folder behind.
    stale = ray_temp_dir(worker_home) / "aicluster-work" / "killed-0a1b2c-a1-r0"
    stale.mkdir(parents=True)
    (stale / "output.log").write_text("last words\n")
    run(
        worker_home,
        "join",
        ray_address,
        "--pool",
        "p2",
        "--label",
        "rack=r1",
        "--num-cpus",
        "2",
        "--num-gpus",
        "1",
        "--gpu-model",
        "L4",
        "--ray-token-file",
        str(token_file),
    )
    nodes = json.loads(run(home, "nodes", "-o", "json").stdout)
    assert len(nodes) == 2
    joined = next(n for n in nodes if n["pool"] == "p2")
    assert joined["labels"]["rack"] == "r1"
    assert joined["cpus"] == 2 and joined["gpus"] == 1 and joined["gpu_model"] == "L4"
    assert joined["alive"] and joined["memory"] > 0
    table = run(home, "nodes").stdout
    assert "p2" in table and "rack=r1" in table
    # Both machines have a stable id in their installation home, which names their node.
    machine_ids = {}
    for h in (home, worker_home):
        path = h / "machine-id"
        assert path.stat().st_mode & 0o777 == 0o600
        machine_ids[h] = path.read_text().strip()
    assert {n["machine_id"] for n in nodes} == set(machine_ids.values())
    assert joined["machine_id"] == machine_ids[worker_home]
    assert joined["name"].endswith("-" + machine_ids[worker_home][:6])
    assert joined["incarnations"] == 1 and "aicluster.io/machine" not in joined["labels"]

    # The machine goes away and joins again from the same home: the same node, back Ready.
    run(worker_home, "down")
    run(
        worker_home,
        "join",
        ray_address,
        *("--pool", "p2", "--label", "rack=r1", "--num-cpus", "2", "--num-gpus", "1"),
        *("--gpu-model", "L4"),
    )

    def rejoined():
        ns = json.loads(run(home, "nodes", "-o", "json").stdout)
        n = next(n for n in ns if n["pool"] == "p2")
        return len(ns) == 2 and n["alive"] and n["incarnations"] == 2 and n

    again = wait_for(rejoined, timeout=60, what="one node for the rejoined machine")
    assert (again["name"], again["machine_id"]) == (joined["name"], joined["machine_id"])
    assert again["node_id"] != joined["node_id"]
    assert again["state"] == "Ready"
    assert not stale.exists(), "a (re)joining machine clears the folders of killed attempts"


def test_bad_spec_names_field_and_line(platform, tmp_path):
    home = platform[0]
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: job\nname: bad\ncommand: 'true'\nresources:\n  gpus: many\n")
    proc = run(home, "submit", str(bad), check=False)
    assert proc.returncode == 2
    assert "resources.gpus" in proc.stderr and "line 5" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert json.loads(run(home, "jobs", "-o", "json").stdout) == []


def test_ddp_example_runs_to_success_with_identical_parameters(platform):
    home = platform[0]
    proc = run(home, "submit", "examples/ddp-train/job.yaml", "--follow", timeout=300)
    job_id = re.search(r"submitted (\S+)", proc.stdout).group(1)
    hashes = []
    for rank in (0, 1):
        log = run(home, "logs", job_id, "--rank", str(rank)).stdout
        m = re.search(r"final step 200 rank %d params_sha256 ([0-9a-f]{64})" % rank, log)
        assert m, log[-2000:]
        hashes.append(m.group(1))
    assert hashes[0] == hashes[1]
    job = json.loads(run(home, "describe", job_id, "-o", "json").stdout)
    assert job["status"] == "SUCCEEDED" and len(job["placement"]) == 2
    assert [e["to_status"] for e in job["events"] if e["to_status"]][-1] == "SUCCEEDED"
    jobs = json.loads(run(home, "jobs", "-o", "json").stdout)
    assert [j["id"] for j in jobs] == [job_id]


def test_cancel_from_the_cli(platform, tmp_path):
    home = platform[0]
    spec = tmp_path / "sleep.yaml"
    spec.write_text("kind: job\nname: nap\ncommand: sleep 600\n")
    job_id = re.search(r"submitted (\S+)", run(home, "submit", str(spec)).stdout).group(1)
    run(home, "cancel", job_id)
    job = json.loads(run(home, "describe", job_id, "-o", "json").stdout)
    assert job["status"] == "CANCELLED" and job["reason"] == "cancelled_by_user"


def test_teams_and_tokens_from_the_cli(platform):
    home = platform[0]
    run(home, "teams", "create", "vision")
    assert "vision" in json.loads(run(home, "teams", "list", "-o", "json").stdout)
    token = run(home, "tokens", "create", "--user", "alice", "--team", "vision").stdout.strip()
    assert token.startswith("aic_")
    as_alice = ["--token", token]
    assert json.loads(run(home, "jobs", "-o", "json", *as_alice).stdout) == []
    proc = run(home, "teams", "create", "other", *as_alice, check=False)
    assert proc.returncode == 1 and "admin" in proc.stderr
    proc = run(home, "jobs", "--token", "aic_wrong", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr


def test_deploy_a_service_and_call_it_with_openai(platform):
    import openai

    from aicluster.client.api import Client

    from harness import wait_for

    home = platform[0]
    out = run(home, "deploy", "examples/services/simulated-llm.yaml").stdout
    assert "deployed default/sim-llm" in out
    url = json.loads((home / "client.json").read_text())["url"]
    token = (home / "admin.token").read_text().strip()
    sdk = Client(url, token)
    wait_for(lambda: sdk.service("sim-llm")["ready"] == 2, timeout=120, what="2 ready replicas")
    client = openai.OpenAI(base_url=url + "/v1", api_key=token)
    reply = client.completions.create(model="sim-llm", prompt="hello world", max_tokens=4)
    assert reply.choices[0].text
    # The gateway process `up` started serves the same service on its own port.
    gateway = re.search(r"gateway:\s+(\S+)", platform[2]).group(1)
    assert gateway == json.loads((home / "gateway.json").read_text())["url"] + "/v1"
    assert gateway in run(home, "info").stdout
    via = openai.OpenAI(base_url=gateway, api_key=token, max_retries=0)
    wait_for(
        lambda: "sim-llm" in {m.id for m in via.models.list()},
        timeout=10,
        what="the gateway's table",
    )
    reply = via.completions.create(model="sim-llm", prompt="hello world", max_tokens=4)
    assert reply.choices[0].text and reply.usage.completion_tokens == 4
    listed = json.loads(run(home, "services", "-o", "json").stdout)
    assert [s["name"] for s in listed] == ["sim-llm"]
    described = run(home, "describe", "sim-llm").stdout
    assert described.count("READY") >= 2
    run(home, "delete", "sim-llm")
    wait_for(lambda: sdk.services() == [], timeout=60, what="the service to go")


def test_down_leaves_no_process(platform, tmp_path):
    home, worker_home, _ = platform
    assert installation_processes(home)
    spec = tmp_path / "nap.yaml"
    spec.write_text("kind: job\nname: left-running\ncommand: sleep 600\n")
    run(home, "submit", str(spec))
    work = [ray_temp_dir(h) / "aicluster-work" for h in (home, worker_home)]
    wait_for(lambda: any(w.exists() and any(w.iterdir()) for w in work), what="a work folder")
    run(worker_home, "down")
    run(home, "down")
    assert not any(w.exists() for w in work), "down removes the workloads' folders"
    assert installation_processes(home) == []
    assert installation_processes(worker_home) == []
    assert not [c for c in _cmdlines() if "aicluster.api.server" in c and str(home) in c]
    assert not [c for c in _cmdlines() if "aicluster.gateway.process" in c and str(home) in c]
    assert not (home / "gateway.json").exists()


def _cmdlines() -> list[str]:
    out = []
    for p in psutil.process_iter():
        try:
            out.append(" ".join(p.cmdline()))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


@pytest.mark.parametrize(
    "args,named",
    [
        (("up", "--pool", "Bad Pool"), "--pool"),
        (("up", "--label", "rack=r1\x1b[31m"), "--label"),
        (("join", "127.0.0.1:1", "--pool", "p\nFAKE"), "--pool"),
        (("join", "127.0.0.1:1", "--gpu-model", "H100\x07"), "--gpu-model"),
    ],
)
def test_bad_pool_label_and_gpu_model_are_refused_before_anything_is_written(tmp_path, args, named):
    home = tmp_path / "h"
    proc = run(home, *args, check=False, timeout=60)
    assert proc.returncode == 2 and named in proc.stderr and "Traceback" not in proc.stderr
    assert not home.exists()
