"""`aicluster doctor` on a 3-node local cluster, as a user runs it (the CLI, a real job).

The test adds three 1-CPU nodes of their own (GPU model label `doctor-test`, no GPUs, so
no other test's job lands there and the doctor's whole-node workers can only land there)
and slows one of them. How: every Ray node here is a process on one machine sharing the
kernel's loopback, so `tc netem` on `lo` would slow every pair alike, and a network
namespace per Ray node needs privileges and a cluster started inside them. The doctor's
hidden `--inject-delay NODE_ID:MS` makes the probe on that node sleep MS before each
message it sends, each all-reduce it joins and each artifact transfer: a link with MS of
latency, on that node only. The verdicts must then single it out from figures alone —
the judgement (core.doctor) never sees which node was slowed.
"""

from __future__ import annotations

import json

import pytest

from aicluster.client import artifacts
from aicluster.client.api import TERMINAL, ApiError
from aicluster.engine.protocol import GPU_MODEL_LABEL, POOL_LABEL

from harness import COMMON_NODE_ARGS, run_cli, wait_for

pytestmark = pytest.mark.timeout(300)
MODEL = "doctor-test"
NUMBERS = (
    "p2p_bw",
    "p2p_node",
    "allreduce_busbw",
    "allreduce_latency",
    "storage_write",
    "storage_read",
    "cpu_mem_bw",
    "cpu_matmul",
)
GPU_CHECKS = ("gpu_matmul", "gpu_mem_bw", "gpu_nvml", "gpu_ecc")


@pytest.fixture(scope="module")
def three_nodes(ray_cluster, admin):
    cluster, _ = ray_cluster
    # a gang without a pool tries pools in name order: this one sorts after the session's
    # pools, so that no leftover of another test takes one of these nodes' only CPU
    labels = {POOL_LABEL: "zz-doctor", GPU_MODEL_LABEL: MODEL}
    added = [
        cluster.add_node(num_cpus=1, num_gpus=0, labels=labels, **COMMON_NODE_ARGS)
        for _ in range(3)
    ]
    ids = {n.node_id for n in added}
    wait_for(
        lambda: sum(n["node_id"] in ids and n["state"] == "Ready" for n in admin.nodes()) == 3,
        timeout=120,
        what="three Ready doctor nodes",
    )
    yield [n.node_id for n in added]
    for node_id in ids:
        try:
            admin.request_json("POST", f"/v1/nodes/{node_id}/uncordon")
        except ApiError:
            pass
    for node in added:
        cluster.remove_node(node, allow_graceful=True)


def cli(control_plane, tmp_path, *args):
    return run_cli(
        tmp_path,
        "doctor",
        "--url",
        control_plane.url,
        "--token",
        control_plane.admin_token,
        *args,
        check=False,
        timeout=280,
    )


def test_doctor_measures_every_check_and_flags_the_slowed_node(
    control_plane, admin, three_nodes, tmp_path
):
    slow = three_nodes[1]
    proc = cli(
        control_plane,
        tmp_path,
        "--nodes",
        ",".join(three_nodes),
        "--inject-delay",
        f"{slow}:50",
        "--p2p-bytes",
        str(1 << 20),
        "--allreduce-bytes",
        str(256 << 10),
        "--storage-bytes",
        str(4 << 20),
        "--cordon-failing",
        "-o",
        "json",
    )
    (tmp_path / "report.json").write_text(proc.stdout)  # kept with the test's files
    assert proc.returncode == 1, proc.stdout + proc.stderr  # a failed check exits 1
    report = json.loads(proc.stdout)
    checks = report["checks"]
    by_check: dict[str, list[dict]] = {}
    for c in checks:
        by_check.setdefault(c["check"], []).append(c)
    for name in NUMBERS:
        assert by_check.get(name), f"no {name} in {sorted(by_check)}"
        assert all(isinstance(c["value"], float) and c["value"] > 0 for c in by_check[name]), (
            by_check[name]
        )
    for name in GPU_CHECKS:  # no CUDA, no NVML here: never a fake ok
        assert len(by_check[name]) == 3
        assert {(c["verdict"], c["value"]) for c in by_check[name]} == {("not_applicable", None)}
    assert len(by_check["p2p_bw"]) == 3  # every pair of three nodes
    assert sorted(c["nodes"] for c in by_check["allreduce_busbw"]) == [2, 3]
    for name in ("storage_write", "storage_read", "cpu_mem_bw", "cpu_matmul"):
        assert sorted(c["node"] for c in by_check[name]) == sorted(three_nodes)

    # the slowed node, and only it, fails; its links are slow, the other link is fine
    assert report["failing_nodes"] == [slow], json.dumps(checks, indent=1)
    assert report["slow_links"] == []
    verdict = {c["node"]: c["verdict"] for c in by_check["p2p_node"]}
    assert verdict == {n: ("fail" if n == slow else "ok") for n in three_nodes}
    for pair in by_check["p2p_bw"]:
        assert pair["verdict"] == ("fail" if slow in (pair["node"], pair["peer"]) else "ok")
    assert report["verdict"] == "fail" and report["cordoned"] == [slow]
    states = {n["node_id"]: n["state"] for n in admin.nodes() if n["node_id"] in three_nodes}
    assert states == {n: ("Cordoned" if n == slow else "Ready") for n in three_nodes}

    # the control plane judged the job's logs and kept the report, found by node
    stored = admin.request_json("GET", "/v1/doctor/reports", params={"node": slow})["reports"]
    assert stored[0]["id"] == report["report_id"] and stored[0]["job_id"] == report["job_id"]
    assert stored[0]["failing_nodes"] == [slow] and stored[0]["verdict"] == "fail"
    assert stored[0]["report"]["checks"] == checks and stored[0]["created_by"] == "admin"

    job = admin.job(report["job_id"])
    assert job["status"] == "SUCCEEDED" and sorted(job["placement"]) == sorted(three_nodes)
    assert job["spec"]["nodes"] == three_nodes  # pinned to the named nodes
    try:  # what its ranks pushed does not outlive the run
        left = artifacts.describe(admin, f"{job['team']}/{job['name']}-ckpt").get("versions")
    except ApiError as gone:
        assert gone.status_code == 404
    else:
        assert not left, left


def test_a_job_pinned_to_nodes_runs_only_there(admin, three_nodes):
    # Unpinned, the tie between idle nodes of one shape goes to the first by name and id;
    # pinned to the last of the uncordoned ones, the job runs there (core.topology).
    target = max(three_nodes[0], three_nodes[2])
    spec = {
        "kind": "job",
        "name": "pinned-one",
        "resources": {"cpus": 1, "gpu_model": MODEL},
        "nodes": [target],
        "command": ["python", "-c", "pass"],
    }
    job = admin.wait(admin.submit(spec)["id"], TERMINAL, timeout=120)
    assert job["status"] == "SUCCEEDED" and job["placement"] == [target], job
    with pytest.raises(ApiError) as bad:
        admin.submit({**spec, "nodes": ["not a node"]})
    assert bad.value.status_code == 422 and "nodes" in bad.value.message, bad.value.message


def test_doctor_refuses_bad_options_naming_them(control_plane, three_nodes, tmp_path):
    unknown = cli(control_plane, tmp_path, "--nodes", "no-such-node")
    assert unknown.returncode == 2 and "--nodes" in unknown.stderr
    assert "no-such-node" in unknown.stderr and "Traceback" not in unknown.stderr
    delay = cli(control_plane, tmp_path, "--nodes", three_nodes[0], "--inject-delay", "x")
    assert delay.returncode == 2 and "--inject-delay" in delay.stderr
    plan = tmp_path / "plan.yaml"
    plan.write_text("kind: plan\nname: p\nhardware: {network: no-such-net}\n")
    bad = cli(control_plane, tmp_path, "--expect", str(plan))
    assert bad.returncode == 2 and "plan.yaml" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr
