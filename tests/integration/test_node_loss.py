"""A node that dies under a running job: the job ends node_lost, or goes back to the
queue when it has restarts left, and no other job is touched."""

from __future__ import annotations

from aicluster.engine.protocol import GPU_MODEL_LABEL, POOL_LABEL
from harness import COMMON_NODE_ARGS, TERMINAL, wait_for


def test_node_death_fails_or_requeues_its_jobs(ray_cluster, admin):
    cluster, _ = ray_cluster
    labels = {POOL_LABEL: "spot", GPU_MODEL_LABEL: "T4"}
    node = cluster.add_node(num_cpus=2, num_gpus=2, labels=labels, **COMMON_NODE_ARGS)
    wait_for(lambda: any(n["gpu_model"] == "T4" and n["alive"] for n in admin.nodes()),
             what="the T4 node")  # fmt: skip
    spec = {"kind": "job", "command": "sleep 600", "resources": {"cpus": 1, "gpus": 1, "gpu_model": "T4"}}
    once = admin.submit({**spec, "name": "fragile"}, None)
    retry = admin.submit({**spec, "name": "resilient", "max_restarts": 1}, None)
    bystander = admin.submit({"kind": "job", "name": "bystander", "command": "sleep 600"}, None)
    for job in (once, retry, bystander):
        admin.wait(job["id"], {"RUNNING"}, timeout=60)

    cluster.remove_node(node, allow_graceful=False)

    failed = admin.wait(once["id"], TERMINAL, timeout=60)
    assert failed["status"] == "FAILED" and failed["reason"] == "node_lost", failed
    requeued = wait_for(
        lambda: (j := admin.job(retry["id"]))["restarts"] == 1 and j, timeout=60, what="requeue"
    )
    assert requeued["status"] == "PENDING"
    assert any(
        e["reason"] == "requeued" and e["message"].startswith("node_lost")
        for e in requeued["events"]
    )
    # Its only T4 node is gone, so it waits and says why.
    waiting = wait_for(lambda: (j := admin.job(retry["id"]))["message"] and "T4" in j["message"] and j,
                       what="wait reason")  # fmt: skip
    assert "GPU model T4" in waiting["message"]
    assert admin.job(bystander["id"])["status"] == "RUNNING"
    assert any(e["type"] == "NodeLost" for e in admin.events())
    for job in (retry, bystander):
        admin.cancel(job["id"])
