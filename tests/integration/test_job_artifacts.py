"""Jobs consume artifacts as read-only inputs and produce new versions as outputs."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from aicluster.client import artifacts as arts
from aicluster.client.api import ApiError

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def test_job_reads_an_input_and_pushes_an_output(admin, tmp_path):
    src = tmp_path / "dataset"
    (src / "sub").mkdir(parents=True)
    (src / "hello.txt").write_text("hello from the dataset\n")
    (src / "sub" / "numbers.csv").write_text("1,2,3\n")
    version = arts.push(admin, src, "default/ja-data", "dataset")
    cmd = (
        'cat "$DATA_DIR/hello.txt"; '
        "stat -c 'mode=%a' data data/hello.txt; "
        "mkdir out && cp data/sub/numbers.csv out/ && echo made-here > out/new.txt"
    )
    spec = {
        "kind": "job",
        "name": "ja-consumer",
        "command": cmd,
        "workers": 2,
        "inputs": [{"artifact": "default/ja-data:1", "path": "data", "env": "DATA_DIR"}],
        "outputs": [{"path": "out", "artifact": "default/ja-result", "kind": "dataset"}],
    }
    job = admin.submit(spec, None)
    done = admin.wait(job["id"], TERMINAL, timeout=90)
    assert done["status"] == "SUCCEEDED", done
    assert "produced default/ja-result:1" in done["message"]
    for rank in range(2):
        log = admin.logs(job["id"], rank=rank)[0].decode()
        assert "hello from the dataset" in log
        # the worker said where its input was (runtime.inputs_progress) before the command ran
        ready = log.index("aicluster inputs: ready data: ")
        assert ready < log.index("hello from the dataset")
        # read-only for everyone but root (who ignores modes: these tests may run as root)
        assert all(m in ("mode=555", "mode=444") for m in log.split() if m.startswith("mode="))
        assert log.count("mode=") == 2
    got, path = arts.pull(admin, "default/ja-result:1", tmp_path / "result")
    assert (path / "numbers.csv").read_text() == "1,2,3\n"
    assert (path / "new.txt").read_text() == "made-here\n"
    assert got["version"] == 1 and version["version"] >= 1


def test_bad_input_or_output_is_refused_at_submit(admin):
    before = len(admin.jobs(every=True))
    bad = {
        "kind": "job",
        "name": "ja-bad",
        "command": "true",
        "inputs": [{"artifact": "default/no-such-thing:3", "path": "d"}],
        "outputs": [{"path": "o", "artifact": "other-team/x"}],
    }
    with pytest.raises(ApiError) as exc:
        admin.submit(bad, None)
    assert exc.value.status_code == 422
    fields = {i["field"] for i in exc.value.issues}
    assert fields == {"inputs.0.artifact", "outputs.0.artifact"}
    assert len(admin.jobs(every=True)) == before


def test_missing_output_fails_the_job(admin):
    spec = {
        "kind": "job",
        "name": "ja-nothing",
        "command": "true",
        "outputs": [{"path": "never-made", "artifact": "default/ja-none"}],
    }
    job = admin.submit(spec, None)
    done = admin.wait(job["id"], TERMINAL, timeout=60)
    assert done["status"] == "FAILED" and done["reason"] == "output_failed"
    assert "never-made" in done["message"]


CKPT_SCRIPT = """
import pathlib, sys, time
from aicluster.runtime import checkpoint

found = checkpoint.latest()
if found is not None:
    print("resumed from", (found / "state.txt").read_text().strip(), flush=True)
    sys.exit(0)
state = pathlib.Path("work"); state.mkdir()
(state / "state.txt").write_text("step 5 on " + __import__("os").environ["AICLUSTER_NODE_ID"])
print("saved", checkpoint.save(state, step=5), flush=True)
time.sleep(600)
"""


def test_job_resumes_from_an_artifact_checkpoint_on_another_node(
    ray_cluster, control_plane, admin, tmp_path, state_db
):
    from aicluster.client.api import pack_workdir
    from aicluster.engine.protocol import GPU_MODEL_LABEL, POOL_LABEL

    from harness import COMMON_NODE_ARGS, wait_for

    cluster, _ = ray_cluster
    labels = {POOL_LABEL: "ckpt2", GPU_MODEL_LABEL: "P100"}
    nodes = [
        cluster.add_node(num_cpus=1, num_gpus=1, labels=labels, **COMMON_NODE_ARGS)
        for _ in range(2)
    ]
    removed: list = []
    try:  # the P100 nodes must not outlive the test, whatever fails (later modules count nodes)
        wait_for(
            lambda: sum(n["gpu_model"] == "P100" and n["alive"] for n in admin.nodes()) == 2,
            what="two P100 nodes",
        )
        (tmp_path / "code").mkdir()
        (tmp_path / "code" / "job.py").write_text(CKPT_SCRIPT)
        spec = {
            "kind": "job",
            "name": "ckpt-mover",
            "working_dir": ".",
            "command": "python job.py",
            "max_restarts": 1,
            "resources": {"cpus": 1, "gpus": 1, "gpu_model": "P100"},
        }
        job = admin.submit(spec, pack_workdir(tmp_path / "code"))
        first = admin.wait(job["id"], {"RUNNING"}, timeout=60)
        wait_for(
            lambda: b"saved default/ckpt-mover-ckpt:" in admin.logs(job["id"])[0],
            timeout=60,
            what="the checkpoint to be saved",
        )
        victim = next(n for n in nodes if n.node_id == first["placement"][0])
        cluster.remove_node(victim, allow_graceful=False)
        removed.append(victim)
        done = admin.wait(job["id"], {"SUCCEEDED", "FAILED"}, timeout=120)
        assert done["status"] == "SUCCEEDED", done
        assert done["attempt"] == 2 and done["placement"] != first["placement"]
        log = admin.logs(job["id"])[0].decode()
        first_log = admin.logs(job["id"], attempt=1)[0].decode()
        assert f"resumed from step 5 on {victim.node_id}" in log, (first, done, first_log, log)
        ckpt = arts.version(admin, "default/ckpt-mover-ckpt:latest")
        assert ckpt["kind"] == "checkpoint" and ckpt["metadata"] == {"step": 5}
        # the save told the scheduler when the job last checkpointed (what a stop loses)
        assert done["last_checkpoint_at"] == ckpt["created_at"]
        kinds = [e["type"] for e in admin.events(object_id=job["id"])]
        assert "JobCheckpointed" in kinds, kinds

        # Each attempt got a token of the job's owner; all are revoked once the job ended.
        def job_tokens():
            with state_db.connect() as db:
                sql = text("SELECT revoked FROM tokens WHERE job_id = :j")
                return db.execute(sql, {"j": job["id"]}).all()

        wait_for(
            lambda: (rows := job_tokens()) and all(r[0] for r in rows),
            timeout=30,
            what="the job's tokens to be revoked",
        )
        assert len(job_tokens()) == 2
    finally:
        for n in nodes:
            if n not in removed:
                cluster.remove_node(n, allow_graceful=True)


def test_jobs_prefer_nodes_that_already_cache_their_inputs(admin, tmp_path):
    src = tmp_path / "d"
    src.mkdir()
    (src / "x.bin").write_bytes(b"x" * 1024)
    arts.push(admin, src, "default/ja-local", "dataset")
    gpu = sorted(
        (n for n in admin.nodes() if n["pool"] == "gpu" and n["alive"]),
        key=lambda n: (n["name"], n["node_id"]),
    )
    first, second = gpu[0]["node_id"], gpu[1]["node_id"]
    # Fill the node best fit would pick, so the first reader lands on the other one.
    filler = admin.submit(
        {"kind": "job", "name": "ja-filler", "command": "sleep 600", "resources": {"cpus": 4}}, None
    )
    spec = {
        "kind": "job",
        "command": "ls data",
        "resources": {"cpus": 1},
        "inputs": [{"artifact": "default/ja-local:1", "path": "data"}],
    }
    try:  # a failure here must not leave the filler holding a node for later modules
        assert admin.wait(filler["id"], {"RUNNING"}, timeout=60)["placement"] == [first]
        reader = admin.submit({**spec, "name": "ja-reader1"}, None)
        done = admin.wait(reader["id"], TERMINAL, timeout=60)
        assert done["status"] == "SUCCEEDED" and done["placement"] == [second]
    finally:
        admin.cancel(filler["id"])
        admin.wait(filler["id"], TERMINAL, timeout=30)
    # Both nodes are free now; best fit alone would choose `first`, the cache says `second`.
    again = admin.wait(admin.submit({**spec, "name": "ja-reader2"}, None)["id"], TERMINAL, 60)
    assert again["status"] == "SUCCEEDED" and again["placement"] == [second]
