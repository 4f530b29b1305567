"""A node that dies under a running job: the job ends node_lost, or goes back to the
queue when it has restarts left, and no other job is touched."""

from __future__ import annotations

from aicluster.engine.protocol import GPU_MODEL_LABEL, POOL_LABEL

from harness import COMMON_NODE_ARGS, TERMINAL, wait_for


def test_node_death_fails_or_requeues_its_jobs(ray_cluster, admin):
    cluster, _ = ray_cluster
    labels = {POOL_LABEL: "spot", GPU_MODEL_LABEL: "T4"}
    node = cluster.add_node(num_cpus=2, num_gpus=2, labels=labels, **COMMON_NODE_ARGS)
    wait_for(
        lambda: any(n["gpu_model"] == "T4" and n["alive"] for n in admin.nodes()),
        what="the T4 node",
    )
    spec = {
        "kind": "job",
        "command": "sleep 600",
        "resources": {"cpus": 1, "gpus": 1, "gpu_model": "T4"},
    }
    once = admin.submit({**spec, "name": "fragile"}, None)
    retry = admin.submit({**spec, "name": "resilient", "max_restarts": 1}, None)
    bystander = admin.submit({"kind": "job", "name": "bystander", "command": "sleep 600"}, None)
    for job in (once, retry, bystander):
        admin.wait(job["id"], {"RUNNING"}, timeout=60)

    cluster.remove_node(node, allow_graceful=False)
    # The first listing that shows the node dead already shows it Down (never "Ready").
    dead = wait_for(
        lambda: [n for n in admin.nodes() if n["gpu_model"] == "T4" and not n["alive"]],
        interval=0.05,
        what="the T4 node seen dead",
    )
    assert [n["state"] for n in dead] == ["Down"], dead

    failed = admin.wait(once["id"], TERMINAL, timeout=60)
    assert failed["status"] == "FAILED" and failed["reason"] == "node_lost", failed
    requeued = wait_for(
        lambda: (j := admin.job(retry["id"]))["restarts"] == 1 and j, timeout=60, what="requeue"
    )
    assert requeued["status"] == "PENDING" and requeued["requeue_cause"] == "node_lost"
    assert any(
        e["reason"] == "requeued" and e["message"].startswith("node_lost")
        for e in requeued["events"]
    )
    # Its only T4 node is gone, so it waits and says why.
    waiting = wait_for(
        lambda: (j := admin.job(retry["id"]))["message"] and "T4" in j["message"] and j,
        what="wait reason",
    )
    assert "GPU model T4" in waiting["message"]
    assert admin.job(bystander["id"])["status"] == "RUNNING"
    assert any(e["type"] == "NodeLost" for e in admin.events(every=True))
    for job in (retry, bystander):
        admin.cancel(job["id"])


def test_checkpointing_job_resumes_on_healthy_nodes_after_node_death(ray_cluster, admin):
    """A 2-worker DDP job loses a node mid-training: the attempt ends node_lost, the job
    runs again on the remaining nodes, resumes from its last checkpoint and succeeds."""
    import re
    from pathlib import Path

    from aicluster.client.api import pack_workdir

    cluster, _ = ray_cluster
    labels = {POOL_LABEL: "ckpt", GPU_MODEL_LABEL: "V100"}
    nodes = [
        cluster.add_node(num_cpus=2, num_gpus=1, labels=labels, **COMMON_NODE_ARGS)
        for _ in range(3)
    ]
    wait_for(
        lambda: sum(n["gpu_model"] == "V100" and n["alive"] for n in admin.nodes()) == 3,
        what="three V100 nodes",
    )
    example = Path(__file__).resolve().parents[2] / "examples" / "ddp-train"
    spec = {
        "kind": "job",
        "name": "ddp-survivor",
        "workers": 2,
        "max_restarts": 1,
        "resources": {"cpus": 1, "gpus": 1, "gpu_model": "V100"},
        "working_dir": ".",
        "command": "python train.py --steps 6000 --checkpoint-every 250",
    }
    job = admin.submit(spec, pack_workdir(example))
    first = admin.wait(job["id"], {"RUNNING"}, timeout=60)
    wait_for(
        lambda: b"checkpoint saved step 1000 " in admin.logs(job["id"])[0],
        timeout=120,
        interval=0.2,
        what="a few checkpoints",
    )
    # Checkpoints go to the artifact store, so the surviving nodes can resume from them.
    assert b"path default/ddp-survivor-ckpt:" in admin.logs(job["id"])[0]
    victim_id = first["placement"][1]
    victim = next(n for n in nodes if n.node_id == victim_id)
    cluster.remove_node(victim, allow_graceful=False)

    done = admin.wait(job["id"], {"SUCCEEDED", "FAILED"}, timeout=240)
    assert done["status"] == "SUCCEEDED", done
    assert done["attempt"] == 2 and done["restarts"] == 1
    assert victim_id not in done["placement"]
    requeue = [e for e in done["events"] if e["reason"] == "requeued"]
    assert requeue and requeue[0]["message"].startswith("node_lost")
    # Recovery is measured from the death, phase by phase, and the work to redo is counted
    # from the newest checkpoint.
    again = next(e for e in done["events"] if e["to_status"] == "RUNNING" and e["message"])
    assert "after node_lost (detection " in again["message"], again
    assert re.search(r"of work since checkpoint step \d+ to redo$", again["message"]), again
    took = done["attempts"][1]["recovery"]
    assert took["cause"] == "node_lost" and took["detection_s"] > 0, took
    phases = took["detection_s"] + took["queue_s"] + took["launch_s"]
    assert abs(took["total_s"] - phases) < 1e-6
    assert done["attempts"][0]["interrupted_at"] < done["attempts"][0]["ended_at"]
    log2 = admin.logs(job["id"], rank=0)[0].decode()
    resumed = int(re.search(r"resumed from step (\d+)", log2).group(1))
    assert resumed >= 1000
    hashes = {
        re.search(r"params_sha256 (\w+)", admin.logs(job["id"], rank=r)[0].decode()).group(1)
        for r in range(2)
    }
    assert len(hashes) == 1, "both ranks end with identical parameters"
    for node in nodes:
        if node is not victim:
            cluster.remove_node(node, allow_graceful=True)
