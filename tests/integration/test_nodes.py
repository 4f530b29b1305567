"""Node states on the session cluster: health agents report, cordon keeps new work
off a node, drain moves replicas first and requeues jobs after the grace period."""

from __future__ import annotations

import httpx

from aicluster.client.api import node_action

from harness import wait_for


def gpu_nodes(admin) -> list[dict]:
    return sorted(
        (n for n in admin.nodes() if n["pool"] == "gpu" and n["alive"]), key=lambda n: n["node_id"]
    )


def test_health_agents_report_every_node(admin):
    def reported():
        nodes = gpu_nodes(admin)
        return len(nodes) >= 2 and all(n["checks"] for n in nodes) and nodes

    nodes = wait_for(reported, timeout=60, what="health reports")
    for n in nodes:
        assert n["state"] == "Ready"
        checks = {c["name"]: c["status"] for c in n["checks"]}
        assert checks["memory"] == "ok" and checks["disk"] == "ok"
        assert checks["gpu"] == "not_applicable", "no NVML here: never a false healthy"


def test_cordon_keeps_new_work_off(admin):
    a, b = gpu_nodes(admin)[:2]
    assert node_action(admin, a["node_id"][:12], "cordon")["state"] == "Cordoned"
    try:
        job = admin.submit(
            {
                "kind": "job",
                "name": "needs-both",
                "workers": 2,
                "resources": {"gpus": 2},
                "command": "true",
            },
            None,
        )
        waiting = wait_for(lambda: (j := admin.job(job["id"]))["message"] and j, what="reason")
        assert waiting["status"] == "PENDING"
    finally:
        assert node_action(admin, a["node_id"][:12], "uncordon")["state"] == "Ready"
    done = admin.wait(job["id"], {"SUCCEEDED", "FAILED"}, timeout=60)
    assert done["status"] == "SUCCEEDED"
    events = [e for e in admin.events(object_id=a["node_id"]) if e["type"] == "NodeStateChanged"]
    assert [(e["from_status"], e["to_status"]) for e in events][-2:] == [
        ("Ready", "Cordoned"),
        ("Cordoned", "Ready"),
    ]


def test_only_admins_cordon(control_plane, admin):
    if "team-n" not in admin.teams():
        admin.create_team("team-n")
    token = admin.create_token("nina", team="team-n")["token"]
    node = gpu_nodes(admin)[0]["node_id"]
    r = httpx.post(
        f"{control_plane.url}/v1/nodes/{node}/cordon", headers={"Authorization": f"Bearer {token}"}
    )
    assert r.status_code == 403


def test_drain_moves_replicas_then_requeues_jobs(control_plane, admin):
    headers = {"Authorization": f"Bearer {control_plane.admin_token}"}
    a, b = gpu_nodes(admin)[:2]
    # A job and a replica pinned onto node a by filling node b first.
    filler = admin.submit(
        {"kind": "job", "name": "filler", "resources": {"cpus": 4}, "command": "sleep 600"}, None
    )
    admin.wait(filler["id"], {"RUNNING"}, timeout=60)
    filled = admin.job(filler["id"])["placement"][0]
    target = a if filled == b["node_id"] else b
    other = b if target is a else a
    job = admin.submit(
        {"kind": "job", "name": "drained", "command": "sleep 600", "max_restarts": 0}, None
    )
    admin.wait(job["id"], {"RUNNING"}, timeout=60)
    assert admin.job(job["id"])["placement"] == [target["node_id"]]
    spec = {
        "kind": "service",
        "name": "mover",
        "model": "m",
        "engine": "simulated",
        "resources": {"cpus": 0.5},
        "replicas": {"min": 1, "max": 1},
    }
    httpx.post(control_plane.url + "/v1/services", json={"spec": spec}, headers=headers)

    def replica():
        reps = httpx.get(control_plane.url + "/v1/services/mover", headers=headers).json()
        return [r for r in reps["replicas"] if r["status"] == "READY"]

    first = wait_for(replica, timeout=90, what="a ready replica")[0]
    assert first["node_id"] == target["node_id"]
    admin.cancel(filler["id"])

    node_action(admin, target["node_id"][:12], "drain", grace_s=0)
    moved = wait_for(
        lambda: (r := replica()) and r[0]["node_id"] == other["node_id"] and r,
        timeout=90,
        what="the replica to move",
    )
    assert moved[0]["id"] != first["id"]
    requeued = wait_for(
        lambda: (j := admin.job(job["id"]))["attempt"] == 2 and j["status"] == "RUNNING" and j,
        timeout=60,
        what="requeue",
    )
    assert requeued["placement"] == [other["node_id"]] and requeued["restarts"] == 0
    assert any((e["message"] or "").startswith("node_drained") for e in requeued["events"])
    started = [e for e in requeued["events"] if e["to_status"] == "RUNNING"]
    assert (
        started[-1]["message"].startswith("recovered ")
        and "after node_drained" in started[-1]["message"]
    )
    wait_for(
        lambda: (
            next(n for n in admin.nodes() if n["node_id"] == target["node_id"])["state"]
            == "Cordoned"
        ),
        timeout=30,
        what="the drained node to be cordoned",
    )
    node_action(admin, target["node_id"][:12], "uncordon")
    admin.cancel(job["id"])
    httpx.delete(control_plane.url + "/v1/services/mover", headers=headers)


def test_a_dead_node_removed_with_nodes_rm_disappears_and_its_events_stay(
    ray_cluster, control_plane, admin
):
    """`aicluster nodes rm` refuses a live node; once Ray has lost it, the node is retired:
    gone from /v1/nodes, `aicluster nodes` and the node metrics; NodeRetired is kept."""
    import json

    from typer.testing import CliRunner

    from aicluster.cli.main import app
    from aicluster.engine.protocol import POOL_LABEL

    from harness import COMMON_NODE_ARGS

    def cli(*args):
        res = CliRunner().invoke(
            app, [*args, "--url", control_plane.url, "--token", control_plane.admin_token]
        )
        return res.exit_code, res.stdout, res.stderr

    cluster, _ = ray_cluster
    node = cluster.add_node(num_cpus=1, labels={POOL_LABEL: "retiring"}, **COMMON_NODE_ARGS)
    node_id = node.node_id
    wait_for(
        lambda: any(n["node_id"] == node_id and n["alive"] for n in admin.nodes()),
        what="the new node",
    )
    code, _, err = cli("nodes", "rm", node_id[:16])
    assert code == 1 and "only a Down node can be removed" in err, err
    cluster.remove_node(node, allow_graceful=False)
    wait_for(
        lambda: any(n["node_id"] == node_id and n["state"] == "Down" for n in admin.nodes()),
        timeout=120,
        what="the node seen Down",
    )
    code, out, err = cli("nodes", "rm", node_id[:16])
    assert code == 0 and f"node {node_id[:12]} is retired" in out, (out, err)

    assert node_id not in {n["node_id"] for n in admin.nodes()}
    code, out, _ = cli("nodes", "-o", "json")
    assert code == 0 and node_id not in {n["node_id"] for n in json.loads(out)}
    r = httpx.get(
        control_plane.url + "/metrics",
        headers={"Authorization": f"Bearer {control_plane.admin_token}"},
    )
    assert 'pool="retiring"' not in "".join(
        line for line in r.text.splitlines() if line.startswith("aicluster_nodes{")
    )
    retired = [e for e in admin.events(object_id=node_id) if e["type"] == "NodeRetired"]
    assert [(e["from_status"], e["to_status"], e["actor"]) for e in retired] == [
        ("Down", "Retired", "admin")
    ]
    code, _, err = cli("nodes", "rm", node_id[:16])
    assert code == 1 and "no node match" in err, "a retired node is gone"
