"""Starting and stopping the Ray processes of one machine (`ray start` / kill).

Invariants: every process started here carries this installation's RAY_TMPDIR in
its environment, which is how `kill_installation` finds all of them — Ray's
daemons, actor workers and the user commands they run — and nothing else. Ray's
agents write their process title over the start of their environment, so the raw
environment is searched for the temp dir and the token path alike (never for
AICLUSTER_HOME, which the user's own shell may carry); the sandboxed commands (a
scrubbed environment, another user) are found as descendants of the installation's
processes. The caller and its ancestors are never among them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from aicluster.engine.rayenv import ray_env, ray_temp_dir, ray_token_path

# Ray declares a dead node dead after ~14 s by default. The head checks every raylet every
# 0.5 s and gives up after 3 failed checks: a machine whose raylet refuses connections
# (its processes killed, the host up) is declared dead in ~1.5 s, one that drops packets
# (power or network lost) in ~3 x (timeout + period) = ~4.5 s, and a live raylet must stall
# for ~4.5 s to be taken for dead. (1 s checks took 2.3-3.2 s to see a killed node in
# bench/node_chaos.py, most of issue 20's 5 s recovery budget; see shared/RAY-NOTES.md.)
NODE_DEATH_DETECTION = {
    "health_check_period_ms": 500,
    "health_check_failure_threshold": 3,
    "health_check_timeout_ms": 1000,
}


class RayStartError(Exception):
    pass


def _ray_bin() -> str:
    return str(Path(sys.executable).parent / "ray")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _labels_arg(labels: dict[str, str]) -> list[str]:
    if not labels:
        return []
    return ["--labels", ",".join(f"{k}={v}" for k, v in sorted(labels.items()))]


def _common_args(home: Path, node_ip: str, num_cpus, num_gpus, labels: dict[str, str]) -> list[str]:
    args = [
        f"--node-ip-address={node_ip}",
        f"--temp-dir={ray_temp_dir(home)}",
        "--disable-usage-stats",
        f"--dashboard-agent-listen-port={_free_port()}",
        f"--dashboard-agent-grpc-port={_free_port()}",
        f"--runtime-env-agent-port={_free_port()}",
        f"--metrics-export-port={_free_port()}",
    ]
    if num_cpus is not None:
        args.append(f"--num-cpus={num_cpus}")
    if num_gpus is not None:
        args.append(f"--num-gpus={num_gpus}")
    return args + _labels_arg(labels)


def _run(
    cmd: list[str], home: Path, loopback: bool, log_name: str, extra_env: dict | None = None
) -> None:
    env = dict(os.environ)
    env.update(ray_env(home, loopback))
    env.update(extra_env or {})
    log_path = home / log_name
    with open(log_path, "ab") as log:
        proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=180)
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-15:]
        raise RayStartError("`ray start` failed:\n" + "\n".join(tail))


def start_head(
    home: Path,
    *,
    node_ip: str = "127.0.0.1",
    port: int = 0,
    num_cpus=None,
    num_gpus=None,
    labels: dict[str, str] | None = None,
    gcs_state: str | None = None,
) -> str:
    """Start this machine's Ray head; return its address host:port. `gcs_state`: where
    Ray keeps the cluster's state (engine.gcs_state; None: the head's memory)."""
    from aicluster.engine.gcs_state import parse

    gcs_env = parse(gcs_state)
    port = port or _free_port()
    cmd = [
        _ray_bin(),
        "start",
        "--head",
        f"--port={port}",
        "--include-dashboard=false",
        f"--system-config={json.dumps(NODE_DEATH_DETECTION)}",
    ]
    cmd += _common_args(home, node_ip, num_cpus, num_gpus, labels or {})
    _run(cmd, home, node_ip.startswith("127."), "ray-start.log", gcs_env)
    return f"{node_ip}:{port}"


def join(
    home: Path,
    head: str,
    *,
    node_ip: str = "127.0.0.1",
    num_cpus=None,
    num_gpus=None,
    labels: dict[str, str] | None = None,
) -> None:
    loopback = node_ip.startswith("127.")
    if loopback:
        args = {
            "gcs_address": head,
            "node_ip": node_ip,
            "num_cpus": num_cpus,
            "num_gpus": num_gpus,
            "labels": labels or {},
            "temp_dir": str(ray_temp_dir(home)),
            "dashboard_agent_listen_port": _free_port(),
            "runtime_env_agent_port": _free_port(),
            "metrics_export_port": _free_port(),
        }
        cmd = [sys.executable, "-m", "aicluster.engine.raynode_join", json.dumps(args)]
    else:
        cmd = [_ray_bin(), "start", f"--address={head}"]
        cmd += _common_args(home, node_ip, num_cpus, num_gpus, labels or {})
    _run(cmd, home, loopback, "ray-join.log")


def installation_processes(home: Path) -> list[psutil.Process]:
    """Every live process of this installation on this machine, and their descendants."""
    marks = (
        f"RAY_TMPDIR={ray_temp_dir(home)}\0".encode(),
        f"RAY_AUTH_TOKEN_PATH={ray_token_path(home)}\0".encode(),
    )
    me = psutil.Process()
    spared = {me.pid} | {p.pid for p in me.parents()}
    found: dict[int, psutil.Process] = {}
    for pid in psutil.pids():
        if pid in spared:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                raw = f.read()
            if any(m in raw for m in marks):
                found[pid] = psutil.Process(pid)
        except (OSError, psutil.NoSuchProcess):
            continue
    for proc in list(found.values()):
        try:
            for child in proc.children(recursive=True):
                found.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass
    return [p for p in found.values() if p.pid not in spared and _running(p)]


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# Ray's own daemons, by what their command lines hold: they hold nothing of a workload's,
# and the raylet and GCS sit out SIGTERM for many seconds, so once only they are left
# they get SIGKILL at once.
_RAY_DAEMONS = (
    "/ray/core/src/ray/raylet/raylet",
    "/ray/core/src/ray/gcs/gcs_server",
    "/ray/dashboard/",
    "/ray/_private/log_monitor.py",
    "/ray/autoscaler/_private/monitor.py",
    "ray::RuntimeEnvAgent",
    "ray::DashboardAgent",
)


def _ray_daemon(p: psutil.Process) -> bool:
    try:
        line = " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return True  # gone or going: nothing to wait for
    return any(d in line for d in _RAY_DAEMONS)


def kill_installation(home: Path, grace: float = 10.0) -> int:
    """Terminate every process of this installation; return how many there were.
    Workloads and workers get up to `grace` seconds after SIGTERM; Ray's daemons no
    more than that, and nothing once they are all that is left."""
    procs = installation_processes(home)
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    deadline, alive = time.monotonic() + grace, procs
    while alive and time.monotonic() < deadline:
        _, alive = psutil.wait_procs(alive, timeout=0.2)
        if all(_ray_daemon(p) for p in alive):
            break
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    deadline = time.time() + 5
    while installation_processes(home) and time.time() < deadline:
        for p in installation_processes(home):
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.2)
    return len(procs)
