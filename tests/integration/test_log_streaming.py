"""Logs that survive the machine: what a job printed just before its node was killed
reaches the job's log, streamed off the node to the log sink (engine.logsink)."""

from __future__ import annotations

import os
import signal
import time
import uuid

import psutil

from aicluster.engine.protocol import GPU_MODEL_LABEL, POOL_LABEL

from harness import COMMON_NODE_ARGS, TERMINAL, wait_for

SCRIPT = """
import pathlib, sys, time
tag, flag = sys.argv[1], pathlib.Path(sys.argv[2])
print("starting", flush=True)
time.sleep(1.0)
for i in range(5):
    print(f"last-words {tag} {i}", flush=True)
flag.write_text("printed")
time.sleep(600)
"""


def kill_machine(cluster, node) -> None:
    """SIGKILL the node's whole process tree (raylet, its workers, their commands) at once,
    as a machine that loses power would, then drop it from the test cluster's books."""
    roots = [
        info.process.pid
        for infos in node.all_processes.values()
        for info in infos
        if info.process is not None
    ]
    procs = []
    for pid in roots:
        try:
            root = psutil.Process(pid)
            procs += [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    for p in procs:
        try:
            os.kill(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    cluster.remove_node(node, allow_graceful=False)


def test_lines_printed_just_before_the_node_dies_reach_the_log(ray_cluster, admin, shared_dir):
    cluster, _ = ray_cluster
    labels = {POOL_LABEL: "doomed", GPU_MODEL_LABEL: "K80"}
    node = cluster.add_node(num_cpus=2, num_gpus=1, labels=labels, **COMMON_NODE_ARGS)
    wait_for(
        lambda: any(n["gpu_model"] == "K80" and n["alive"] for n in admin.nodes()),
        what="the K80 node",
    )
    tag = uuid.uuid4().hex[:12]
    flag = shared_dir / "printed"
    spec = {
        "kind": "job",
        "name": "last-words",
        "command": ["python", "-c", SCRIPT, tag, str(flag)],
        "resources": {"cpus": 1, "gpus": 1, "gpu_model": "K80"},
        "max_restarts": 0,
    }
    job = admin.submit(spec, None)
    admin.wait(job["id"], {"RUNNING"}, timeout=60)
    wait_for(flag.exists, timeout=60, interval=0.002, what="the job's lines printed")
    time.sleep(0.025)  # the scenario: the machine dies right after the print
    kill_machine(cluster, node)

    done = admin.wait(job["id"], TERMINAL, timeout=60)
    assert done["status"] == "FAILED" and done["reason"] == "node_lost", done
    text, _next, _status, attempt = admin.logs(job["id"], attempt=1)
    assert attempt == 1
    expected = "starting\n" + "".join(f"last-words {tag} {i}\n" for i in range(5))
    assert text.decode() == expected
