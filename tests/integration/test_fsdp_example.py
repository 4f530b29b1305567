"""The FSDP example (examples/fsdp-train) through the platform: it trains on 2 workers on 2
nodes, loses a node, and the same job name submitted with 3 workers resumes from the
newest sharded checkpoint on 3 nodes with the loss curve of an uninterrupted run.

The reference curve is the example run as one process (no FSDP) to the same step: the
global batch is the same for every worker count, so 1, 2 and 3 workers follow one curve
up to float summation order. TOLERANCE is the README's (examples/fsdp-train, "Tolerance"):
measured differences are at most 5e-7; a resume with a fresh optimizer or data one step
off moves the losses by 1e-2 and more.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from aicluster.client import artifacts
from aicluster.client.api import pack_workdir
from aicluster.engine.protocol import GPU_MODEL_LABEL, POOL_LABEL

from harness import COMMON_NODE_ARGS, TERMINAL, wait_for

pytest.importorskip("torch")
pytestmark = pytest.mark.ray

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fsdp-train"
MODEL = "fsdp-test"  # only this module's nodes have it
STEPS = 60
TOLERANCE = 1e-4
NAME = "fsdp-resize"
CKPT = f"default/{NAME}-ckpt"


def curve(log: str) -> dict[int, float]:
    return {int(s): float(v) for s, v in re.findall(r"^step (\d+) loss (\S+)$", log, re.M)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[int, float]:
    """The uninterrupted curve: the example as one process, outside the platform."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("AICLUSTER_") and k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")
    }
    ckpt = tmp_path_factory.mktemp("fsdp-reference")
    argv = ["--steps", str(STEPS), "--checkpoint-every", "1000", "--checkpoint-dir", str(ckpt)]
    proc = subprocess.run(
        [sys.executable, "train.py", *argv],
        cwd=EXAMPLE,
        env={**env, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref = curve(proc.stdout)
    assert sorted(ref) == list(range(1, STEPS + 1)), proc.stdout[-2000:]
    return ref


def spec(workers: int, command: str) -> dict:
    """The example's job.yaml, pinned to this module's nodes, one worker per node."""
    s = yaml.safe_load((EXAMPLE / "job.yaml").read_text())
    s.update(name=NAME, workers=workers, command=command, max_restarts=0)
    s["resources"] = {**s["resources"], "gpus": 1, "gpu_model": MODEL}
    return s


def log_of(admin, job_id: str, rank: int = 0) -> str:
    return admin.logs(job_id, rank=rank)[0].decode()


def test_fsdp_example_trains_loses_a_node_and_resumes_on_3_workers(ray_cluster, admin, reference):
    cluster, _ = ray_cluster
    labels = {POOL_LABEL: "fsdp", GPU_MODEL_LABEL: MODEL}

    def add_node():
        return cluster.add_node(num_cpus=2, num_gpus=1, labels=labels, **COMMON_NODE_ARGS)

    def alive() -> int:
        return sum(n["gpu_model"] == MODEL and n["alive"] for n in admin.nodes())

    nodes = [add_node() for _ in range(3)]
    workdir = pack_workdir(EXAMPLE)
    try:
        wait_for(lambda: alive() == 3, what=f"three {MODEL} nodes")
        # A checkpoint every step keeps the 2-worker run going while the node is killed.
        first = admin.submit(
            spec(2, f"python train.py --steps {STEPS} --checkpoint-every 1"), workdir
        )
        running = admin.wait(first["id"], {"RUNNING"}, timeout=60)
        assert len(set(running["placement"])) == 2, running
        wait_for(
            lambda: "checkpoint saved step 8 " in log_of(admin, first["id"]),
            timeout=120,
            interval=0.2,
            what="a few sharded checkpoints",
        )
        # Rank 1's node goes, with the shard files it wrote on its own disk.
        victim_id = running["placement"][1]
        victim = next(n for n in nodes if n.node_id == victim_id)
        cluster.remove_node(victim, allow_graceful=False)
        nodes.remove(victim)
        lost = admin.wait(first["id"], TERMINAL, timeout=90)
        assert (lost["status"], lost["reason"]) == ("FAILED", "node_lost"), lost

        # The newest version holds both ranks' shards; the spec keeps the newest 3.
        saved = artifacts.version(admin, CKPT + ":latest")
        step = saved["metadata"]["step"]
        assert 8 <= step < STEPS and saved["metadata"]["world_size"] == 2, saved
        assert {f["path"] for f in saved["files"]} == {".metadata", "__0_0.distcp", "__1_0.distcp"}
        assert saved["producer_job"] == first["id"]
        kept = [v["metadata"]["step"] for v in artifacts.describe(admin, CKPT)["versions"]]
        # 4 only if the platform ended rank 0 between a commit and its prune
        assert kept[-3:] == [step - 2, step - 1, step] and len(kept) in (3, 4), kept
        trained = curve(log_of(admin, first["id"]))
        assert all(abs(trained[s] - reference[s]) <= TOLERANCE for s in range(1, step + 1))

        nodes.append(add_node())  # a replacement joins
        wait_for(lambda: alive() == 3, what=f"three {MODEL} nodes again")
        second = admin.submit(spec(3, f"python train.py --steps {STEPS}"), workdir)
        done = admin.wait(second["id"], TERMINAL, timeout=180)
        assert done["status"] == "SUCCEEDED", (done, log_of(admin, second["id"])[-3000:])
        assert len(set(done["placement"])) == 3 and victim_id not in done["placement"]

        log = log_of(admin, second["id"])
        assert "resharding from 2 to 3 workers" in log, log[-3000:]
        assert re.search(rf"^resumed from step {step}$", log, re.M), log[-3000:]
        resumed = curve(log)
        assert sorted(resumed) == list(range(step + 1, STEPS + 1)), log[-3000:]
        worst = max(abs(resumed[s] - reference[s]) for s in resumed)
        assert worst <= TOLERANCE, {s: (resumed[s], reference[s]) for s in resumed}
        hashes = {
            re.search(r"params_sha256 (\w+)", log_of(admin, second["id"], r)).group(1)
            for r in range(3)
        }
        assert len(hashes) == 1, "every rank ends with the same full parameters"

        final = artifacts.version(admin, CKPT + ":latest")
        assert final["metadata"] == {"step": STEPS, "world_size": 3}, final
        assert final["producer_job"] == second["id"]
        assert {f["path"] for f in final["files"]} == {
            ".metadata",
            "__0_0.distcp",
            "__1_0.distcp",
            "__2_0.distcp",
        }
    finally:
        for node in nodes:
            cluster.remove_node(node, allow_graceful=True)
