"""Entry point of one service replica on its node: build the engine's launch plan
from the node's facts (address, reserved port, granted GPUs), run the engine's
server, run its after-start steps (e.g. load a model into Ollama), then wait.

Run by the engine layer as `python -m aicluster.runtime.replica_main SPEC_JSON`
with MASTER_ADDR/MASTER_PORT/CUDA_VISIBLE_DEVICES set (a one-worker gang).
Invariant: the server is this process's child in the same process group, so
stopping the replica's group stops the server; its exit code becomes ours.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx

from aicluster.runtime.adapters import CommandStep, HttpStep, LaunchPlan, build_launch


def plan_for(spec: dict, env: dict[str, str]) -> LaunchPlan:
    gpus = [int(g) for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    model = spec["model"]
    if model.startswith("artifact:"):  # materialised on this node by the engine layer
        model = env["AICLUSTER_MODEL_PATH"]
    return build_launch(
        spec.get("engine", "builtin"),
        model=model,
        host=env.get("MASTER_ADDR", "127.0.0.1"),
        port=int(env["MASTER_PORT"]),
        gpu_ids=gpus,
        engine_args=spec.get("engine_args") or {},
        served_model_name=spec["name"],
        python=sys.executable,
        base_env=env,
    )


def _wait_healthy(base: str, path: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        try:
            if httpx.get(base + path, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)


def run_steps(plan: LaunchPlan, proc: subprocess.Popen) -> None:
    base = f"http://{plan.host}:{plan.port}"
    for step in plan.after_start:
        if isinstance(step, CommandStep):
            env = dict(plan.env, **step.env)
            subprocess.run(step.argv, env=env, check=True, timeout=step.timeout_s)
        elif isinstance(step, HttpStep):
            _wait_healthy(base, plan.health_path, proc, step.timeout_s)
            httpx.request(step.method, base + step.path, json=dict(step.json),
                          timeout=step.timeout_s).raise_for_status()  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    spec = json.loads((argv or sys.argv[1:])[0])
    plan = plan_for(spec, dict(os.environ))
    print(f"aicluster replica: {' '.join(plan.argv)}", flush=True)
    proc = subprocess.Popen(list(plan.argv), env=dict(plan.env))
    signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
    try:
        run_steps(plan, proc)
    except (subprocess.SubprocessError, httpx.HTTPError, OSError) as exc:
        print(f"aicluster replica: after-start step failed: {exc}", flush=True)
        proc.terminate()
    code = proc.wait()
    return 128 - code if code < 0 else code  # killed by a signal: 128 + its number, as shells do


if __name__ == "__main__":
    sys.exit(main())
