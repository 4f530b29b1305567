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
