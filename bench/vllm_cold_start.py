"""Cold start of a real vLLM replica: `deploy` -> READY, with the engine env and the model
artifact cached on the node or not.

Run:   .venv/bin/python bench/vllm_cold_start.py                  (~3-5 min: cached env)
       .venv/bin/python bench/vllm_cold_start.py --uncached-env   (+ one env build: ~4-8 min)

Everything is private and on loopback, as in tests/harness.py: a temp home, its own Ray
cluster (a head without CPUs and ONE worker node of 4 CPUs, so every replica lands on the
same node and finds what the previous one left in its caches) and the real control plane.
The tiny Llama of examples/models/tiny-llama is made and pushed as an artifact.

Runs, one replica each, deleted (and its vLLM process gone) before the next:
1. env cached, artifact uncached: the env is the one `make test` builds into the shared
   cache (built here first if missing, not timed); the node's blob cache has never seen
   the artifact (a fresh one: a private $TMPDIR for the node).
2. env cached, artifact cached: the same again; the blobs are in the node's cache now.
3. (--uncached-env) env uncached, artifact cached: the same packages under another key
   (`remove` listed in another order), so the replica builds the env itself, as its own
   user (pip, from this machine's local package indexes) before vLLM starts; the env is
   removed afterwards.

Columns: deploy -> STARTING (placed and launched), -> env ready (the replica's log line
`aicluster env: ready`), -> READY (vLLM answers /v1/models naming the service), all wall
seconds on this machine, with its load average (other work on a 2-core machine stretches
every figure).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))  # harness.py: the same real parts the tests use

import yaml

from aicluster.engine.rayenv import ray_env

SPEC = yaml.safe_load((ROOT / "examples" / "services" / "vllm-tiny.yaml").read_text())
READY_LINE = re.compile(r"aicluster env: ready env \S+ (?:built in ([\d.]+) s|\(cached\))")


def start_cluster(node_env: dict[str, str]):
    from ray.cluster_utils import Cluster

    from aicluster.engine.protocol import POOL_LABEL

    from harness import COMMON_NODE_ARGS, FAST_NODE_DEATH

    old = dict(os.environ)
    os.environ.update(node_env)  # the node's processes inherit it
    try:
        cluster = Cluster(
            initialize_head=True,
            connect=False,
            head_node_args=dict(
                num_cpus=0,
                num_gpus=0,
                labels={POOL_LABEL: "system"},
                _system_config=FAST_NODE_DEATH,
                **COMMON_NODE_ARGS,
            ),
        )
        cluster.add_node(num_cpus=4, num_gpus=0, labels={POOL_LABEL: "cpu"}, **COMMON_NODE_ARGS)
        cluster.wait_for_nodes()
    finally:
        os.environ.clear()
        os.environ.update(old)
    return cluster


def one_run(cp, name: str, timeout: float, engine_env: dict | None = None) -> dict:
    import httpx

    from harness import wait_for

    headers = {"Authorization": f"Bearer {cp.admin_token}"}
    spec = {**SPEC, "name": name, "replicas": {"min": 1, "max": 1}, "readiness_timeout_s": 900}
    spec["engine_env"] = engine_env or SPEC["engine_env"]
    t0 = time.monotonic()
    r = httpx.post(cp.url + "/v1/services", json={"spec": spec}, headers=headers, timeout=30)
    r.raise_for_status()
    marks: dict[str, float] = {}

    def ready():
        svc = httpx.get(f"{cp.url}/v1/services/{name}", headers=headers, timeout=30).json()
        reps = svc["replicas"]
        now = time.monotonic() - t0
        if any(x["status"] == "FAILED" for x in reps):
            raise RuntimeError(f"replica FAILED: {[x['message'] for x in reps]}")
        if any(x["status"] in ("STARTING", "READY") for x in reps):
            marks.setdefault("starting", now)
        msgs = " ".join(x["message"] or "" for x in reps)
        if "engine env: ready" in msgs or "engine:" in msgs:
            marks.setdefault("env", now)
        if svc["ready"] == 1:
            marks["ready"] = now
            return True
        return False

    wait_for(ready, timeout=timeout, interval=0.5, what=f"{name} READY")
    log_text = ""
    for f in (cp.home / "logs").glob(f"svc-{name}-*/a1/rank-0.log"):
        log_text += f.read_text(errors="replace")
    m = READY_LINE.search(log_text)
    marks["env_build_s"] = float(m.group(1)) if m and m.group(1) else 0.0
    httpx.delete(f"{cp.url}/v1/services/{name}", headers=headers, timeout=30)
    wait_for(
        lambda: httpx.get(f"{cp.url}/v1/services/{name}", headers=headers).status_code == 404,
        timeout=120,
        what="deletion",
    )
    wait_for(lambda: not _vllm_running(name), timeout=60, what="its vLLM process to go")
    return marks


def _vllm_running(name: str) -> bool:
    import psutil

    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "vllm.entrypoints.openai.api_server" in cmd and name in cmd:
            return True
    return False


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--uncached-env", action="store_true", help="also time an env built cold")
    ap.add_argument("--timeout", type=float, default=900, help="per run, seconds")
    args = ap.parse_args()

    home = Path(tempfile.mkdtemp(prefix="aic-coldstart-"))
    os.environ.update(ray_env(home / "ray-session"))  # before `import ray`
    from aicluster.client.artifacts import push
    from aicluster.runtime import envs

    from harness import ControlPlaneProc, free_port

    root = envs.envs_root()
    env = envs.ensure_env(SPEC["engine_env"], envs.shared_dir(root), lookup=[envs.user_dir(root)])
    print(
        f"vLLM cold start: home {home}; engine env {env.path} ({'built' if env.built else 'cached'})"
    )
    node_tmp = home / "node-tmp"  # a node blob cache that has never seen the artifact
    node_tmp.mkdir(mode=0o1777)
    node_tmp.chmod(0o1777)
    cluster = start_cluster({"TMPDIR": str(node_tmp)})
    cp = ControlPlaneProc(home / "cp", cluster.address, free_port())
    rows = []
    try:
        cp.start()
        admin = cp.client()
        model = home / "tiny-llama"
        make = ROOT / "examples" / "models" / "tiny-llama" / "make_model.py"
        subprocess.run([str(env.python), str(make), str(model)], check=True, capture_output=True)
        push(admin, model, "default/tiny-llama")
        runs = [
            ("env cached, artifact uncached", "cold-a"),
            ("env cached, artifact cached", "cold-b"),
        ]
        for label, name in runs:
            print(f"  {label} ...", flush=True)
            rows.append((label, one_run(cp, name, args.timeout), os.getloadavg()[0]))
        if args.uncached_env:
            # the same packages under another key (`remove` in another order): built cold
            cold_env = {**SPEC["engine_env"], "remove": SPEC["engine_env"]["remove"][::-1]}
            label = "env uncached, artifact cached"
            print(f"  {label} ...", flush=True)
            try:
                marks = one_run(cp, "cold-c", args.timeout, engine_env=cold_env)
            finally:
                for folder in root.glob(f"uid-*/{envs.env_key(cold_env)}"):
                    shutil.rmtree(folder, ignore_errors=True)
            rows.append((label, marks, os.getloadavg()[0]))
    finally:
        cp.stop()
        cluster.shutdown()
    print()
    print(
        f"{'run':32} {'->STARTING s':>13} {'->env ready s':>14} {'env build s':>12} "
        f"{'->READY s':>10} {'load avg':>9}"
    )
    for label, m, load in rows:
        print(
            f"{label:32} {m.get('starting', 0):13.1f} {m.get('env', 0):14.1f} "
            f"{m['env_build_s']:12.1f} {m['ready']:10.1f} {load:9.1f}"
        )
    base = rows[0][1]["ready"]
    for label, m, _ in rows[1:]:
        print(f"{label}: READY {m['ready'] / base:.2f}x the first run's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
