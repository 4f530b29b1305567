"""Entry point of one service replica on its node: build the engine's launch plan
from the node's facts (address, reserved port, granted GPUs), run the engine's
server, run its after-start steps (e.g. load a model into Ollama), then wait.

Run by the engine layer as `python -m aicluster.runtime.replica_main SPEC_JSON`
with MASTER_ADDR/MASTER_PORT/CUDA_VISIBLE_DEVICES set (a one-worker gang).
Invariant: the server is this process's child in the same process group, so
stopping the replica's group stops the server; its exit code becomes ours.

The replica answers only the platform (runtime.replica_auth): with
AICLUSTER_REPLICA_SECRET set, an engine that checks the secret itself (builtin,
simulated) gets it in its environment; any other engine gets a private port on
127.0.0.1 and never sees the secret, and an authenticating proxy in this process
listens on the replica's address (MASTER_ADDR:MASTER_PORT) in its stead.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx

from aicluster.runtime.adapters import CommandStep, HttpStep, LaunchPlan, build_launch
from aicluster.runtime.envs import PYTHON_ENV
from aicluster.runtime.replica_auth import SECRET_ENV, AuthProxy, listen
from aicluster.specs.service import ServiceSpec


def plan_for(spec: ServiceSpec, env: dict[str, str]) -> LaunchPlan:
    gpus = [int(g) for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    model = spec.model
    if model.startswith("artifact:"):  # materialised on this node by the engine layer
        model = env["AICLUSTER_MODEL_PATH"]
    return build_launch(
        spec.engine,
        model=model,
        host=env.get("MASTER_ADDR", "127.0.0.1"),
        port=int(env["MASTER_PORT"]),
        gpu_ids=gpus,
        engine_args=spec.engine_args,
        served_model_name=spec.name,
        python=engine_python(spec, env),
        base_env=env,
        memory=int(spec.resources.memory),
    )


def engine_python(spec: ServiceSpec, env: dict[str, str]) -> str:
    """The engine's interpreter: its declarative env's (found or built on this node by
    runtime.envs before this process started), a venv given by path, else ours."""
    if env.get(PYTHON_ENV):
        return env[PYTHON_ENV]
    if isinstance(spec.engine_env, str):
        return os.path.join(spec.engine_env, "bin", "python")
    return sys.executable


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
            httpx.request(
                step.method, base + step.path, json=dict(step.json), timeout=step.timeout_s
            ).raise_for_status()


def _private_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def secure_plan(spec: ServiceSpec, env: dict[str, str]) -> tuple[LaunchPlan, AuthProxy | None]:
    """The engine's plan, and the auth proxy in front of it when the engine cannot check
    the secret itself (the proxy already listens on the replica's address)."""
    secret = env.get(SECRET_ENV)
    without = {k: v for k, v in env.items() if k != SECRET_ENV}
    plan = plan_for(spec, without)
    if not secret:
        return plan, None
    if plan.checks_secret:
        return plan_for(spec, env), None
    public = (env.get("MASTER_ADDR", "127.0.0.1"), int(env["MASTER_PORT"]))
    private = dict(without, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_private_port()))
    plan = plan_for(spec, private)
    return plan, AuthProxy(listen(*public), plan.host, plan.port, secret).start()


def main(argv: list[str] | None = None) -> int:
    spec = ServiceSpec.model_validate_json((argv or sys.argv[1:])[0])
    # This process runs in the workload sandbox, whose environment is already the
    # allow-listed one (runtime.sandbox.workload_env); the engine gets it less the secret.
    plan, proxy = secure_plan(spec, dict(os.environ))
    if proxy is not None:
        print(f"aicluster replica: engine on {plan.base_url}, behind the auth proxy", flush=True)
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
