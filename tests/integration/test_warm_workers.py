"""Warm workers (engine.prestart): every node keeps idle Ray workers started for the
control plane, so a job's worker actor starts in a process that was up before the job
was even submitted, and the pool is refilled after it is used."""

from __future__ import annotations

import time
import uuid

import psutil

from harness import TERMINAL, wait_for


def _raylet_pids(nodes) -> dict[int, object]:
    out = {}
    for node in nodes:
        for info in node.all_processes.get("raylet", []):
            if info.process is not None:
                out[info.process.pid] = node
    return out


def _idle_workers(raylets: dict[int, object]) -> dict[int, int]:
    """raylet pid -> its idle Ray workers (processes titled ray::IDLE)."""
    counts = dict.fromkeys(raylets, 0)
    for pid in raylets:
        try:
            children = psutil.Process(pid).children()
        except psutil.NoSuchProcess:
            continue
        for child in children:
            try:
                if " ".join(child.cmdline()).startswith("ray::IDLE"):
                    counts[pid] += 1
            except psutil.Error:
                pass
    return counts


def _ray_worker_of(marker: str) -> psutil.Process | None:
    """The Ray worker process (an ancestor titled ray::...) of the command holding marker."""
    psutil.process_iter.cache_clear()  # a kept object of an ended process: a stale create_time
    for proc in psutil.process_iter(["cmdline"]):
        if marker in " ".join(proc.info["cmdline"] or []):
            for parent in proc.parents():
                try:
                    if " ".join(parent.cmdline()).startswith("ray::"):
                        return parent
                except psutil.Error:
                    pass
    return None


def test_a_job_runs_in_a_worker_process_started_before_it_was_submitted(admin, ray_cluster):
    _, nodes = ray_cluster
    raylets = _raylet_pids(nodes)
    wait_for(
        lambda: all(n >= 1 for n in _idle_workers(raylets).values()),
        timeout=60,
        what="a warm worker on every node",
    )
    marker = f"warm-{uuid.uuid4().hex[:8]}"
    submitted = time.time()
    job = admin.submit({"kind": "job", "name": "warm", "command": f"sleep 30 # {marker}"}, None)
    admin.wait(job["id"], {"RUNNING"}, timeout=60)
    worker = wait_for(lambda: _ray_worker_of(marker), timeout=30, what="the job's Ray worker")
    assert worker.create_time() < submitted, "the actor started in a fresh interpreter"
    raylet = worker.parent().pid
    wait_for(
        lambda: _idle_workers(raylets).get(raylet, 0) >= 1,
        timeout=60,
        what="the node's pool refilled after the job took a warm worker",
    )
    admin.cancel(job["id"])
    assert admin.wait(job["id"], TERMINAL, timeout=60)["status"] == "CANCELLED"


_RANKS = """
import json, sys, ray
from ray.experimental import internal_kv
ray.init(address=sys.argv[1], namespace="aicluster", log_to_driver=False, logging_level="ERROR")
out = {}
for name in sys.argv[2:]:
    alias = internal_kv._internal_kv_get(name, namespace="aicluster-actor-alias")
    alias = alias.decode() if alias else None
    def alive(n):
        try:
            ray.get_actor(n)
            return True
        except ValueError:
            return False
    out[name] = {"named": alive(name), "alias": alias, "alias_alive": bool(alias) and alive(alias)}
print(json.dumps(out))
"""


def _ranks(cluster, *names: str) -> dict:
    """What Ray holds for these rank names, asked by a driver of its own: an actor of
    that name, the pooled actor its alias names, and whether that one is alive."""
    import json
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _RANKS, cluster.address, *names],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_cpu_rank_binds_a_pooled_actor_and_a_gpu_rank_gets_one_of_its_own(admin, ray_cluster):
    """A CPU job's rank is a pooled actor (engine.actor_pool) named by its alias, killed
    and unaliased with the job; a GPU rank is an actor made for it under its own name."""
    cluster, _ = ray_cluster
    cpu = admin.submit({"kind": "job", "name": "pooled", "command": "sleep 60"}, None)
    gpu = admin.submit(
        {"kind": "job", "name": "ownactor", "command": "sleep 60", "resources": {"gpus": 1}},
        None,
    )
    try:
        for job in (cpu, gpu):
            admin.wait(job["id"], {"RUNNING"}, timeout=90)
        cpu_rank, gpu_rank = (f"aic-{j['id']}-a1-r0" for j in (cpu, gpu))
        held = _ranks(cluster, cpu_rank, gpu_rank)
        assert held[cpu_rank]["named"] is False
        assert held[cpu_rank]["alias"].startswith("aic-pool-")
        assert held[cpu_rank]["alias_alive"] is True
        assert held[gpu_rank] == {"named": True, "alias": None, "alias_alive": False}
        pooled = held[cpu_rank]["alias"]
    finally:
        for job in (cpu, gpu):
            admin.cancel(job["id"])
    for job in (cpu, gpu):
        assert admin.wait(job["id"], TERMINAL, timeout=60)["status"] == "CANCELLED"
    gone = _ranks(cluster, cpu_rank, gpu_rank, pooled)
    assert gone[cpu_rank] == {"named": False, "alias": None, "alias_alive": False}
    assert gone[gpu_rank]["named"] is False
    assert gone[pooled]["named"] is False  # killed with its job, never handed out again
