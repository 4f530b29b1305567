"""Real parts for integration and e2e tests: a multi-node Ray cluster on one
machine and the control plane as its own process, on loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from aicluster.client.api import Client
from aicluster.engine.protocol import GPU_MODEL_LABEL, POOL_LABEL
from aicluster.engine.raynode import NODE_DEATH_DETECTION

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def marked_processes(mark: str) -> list[int]:
    """The node's live (not zombie) processes whose command line contains `mark`, as this
    test sees them. A sandboxed workload has a PID namespace of its own (runtime.sandbox):
    the pids it sees (`$$`) are not the node's, so tests find its processes by a mark."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmdline = (d / "cmdline").read_bytes()
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue
        if mark.encode() in cmdline and state != "Z":
            out.append(int(d.name))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


AICLUSTER = [sys.executable, "-m", "aicluster.cli.main"]
ROOT = Path(__file__).resolve().parents[1]


def cli_env(home: Path) -> dict:
    """The environment of a user's shell for the installation at `home` (nothing of the
    test session's own Ray or control plane)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "AICLUSTER_"))}
    env["AICLUSTER_HOME"] = str(home)
    return env


def run_cli(home: Path, *args: str, check: bool = True, timeout: float = 240):
    """`aicluster ARGS` as a user runs it, for the installation at `home`."""
    proc = subprocess.run(
        AICLUSTER + list(args),
        env=cli_env(home),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"aicluster {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def wait_for(cond, timeout: float = 60.0, interval: float = 0.1, what: str = "condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


# Ray declares a killed node dead after ~1.5 s instead of ~14 s (see shared/RAY-NOTES.md).
FAST_NODE_DEATH = NODE_DEATH_DETECTION  # what `aicluster up` configures
COMMON_NODE_ARGS = dict(node_ip_address="127.0.0.1", include_dashboard=False)


def start_cluster(ray_home: Path):
    """Head (no CPUs: it runs only the control plane's driver) + two 4-CPU, 2-GPU nodes."""
    from ray.cluster_utils import Cluster

    common = COMMON_NODE_ARGS
    cluster = Cluster(
        initialize_head=True,
        connect=False,
        head_node_args=dict(
            num_cpus=0,
            num_gpus=0,
            labels={POOL_LABEL: "system"},
            _system_config=FAST_NODE_DEATH,
            **common,
        ),
    )
    nodes = []
    for rack in ("r1", "r2"):
        labels = {POOL_LABEL: "gpu", GPU_MODEL_LABEL: "A100", "rack": rack}
        nodes.append(cluster.add_node(num_cpus=4, num_gpus=2, labels=labels, **common))
    cluster.wait_for_nodes()
    return cluster, nodes


@dataclass
class ControlPlaneProc:
    home: Path
    ray_address: str
    port: int
    proc: subprocess.Popen | None = None
    shared: Path | None = None  # a folder jobs may write (their sandbox hides the rest of /tmp)
    args: tuple[str, ...] = ()  # more arguments for aicluster.api.server
    env: dict | None = None  # more environment (AICLUSTER_STATE: the state URL)
    log_name: str = "controlplane.log"  # replicas sharing a home log to files of their own

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_token(self) -> str:
        return (self.home / "admin.token").read_text().strip()

    def start(self) -> None:
        env = dict(os.environ)  # the session's Ray environment (see tests/conftest.py)
        env.update(self.env or {})
        self.home.mkdir(parents=True, exist_ok=True)
        log = open(self.home / self.log_name, "ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "aicluster.api.server",
                "--home",
                str(self.home),
                "--ray-address",
                self.ray_address,
                "--port",
                str(self.port),
                *(["--shared-path", str(self.shared)] if self.shared else []),
                *self.args,
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        client = Client(self.url, None, timeout=5)

        def healthy():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    "control plane exited:\n" + (self.home / self.log_name).read_text()[-3000:]
                )
            try:
                client.health()
                return True
            except Exception:  # noqa: BLE001 - not up yet
                return False

        wait_for(healthy, timeout=90, interval=0.2, what="control plane /healthz")

    def kill9(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill9()

    def client(self, token: str | None = None) -> Client:
        return Client(self.url, token or self.admin_token)


# -- teams and services through the API (the integration modules share these) --------------


def api(cp: ControlPlaneProc, method: str, path: str, token: str | None = None, **kw):
    """One raw API call as the admin (or `token`), for status codes and bodies."""
    headers = {"Authorization": f"Bearer {token or cp.admin_token}"}
    return httpx.request(method, cp.url + path, headers=headers, timeout=30, **kw)


def team_members(cp: ControlPlaneProc, admin: Client, teams) -> dict[str, Client]:
    """A member's client per team (teams made when missing)."""
    for team in teams:
        if team not in admin.teams():
            admin.create_team(team)
    return {
        team: cp.client(admin.create_token(f"user-{team}", team=team)["token"]) for team in teams
    }


def simulated_services(cp: ControlPlaneProc, admin: Client, teams, name: str, time_scale: float):
    """Per team (made when missing): a caller's token record and a one-replica simulated
    service `name`, READY when this returns."""
    callers = {}
    for team in teams:
        if team not in admin.teams():
            admin.create_team(team)
        callers[team] = admin.create_token(f"{team}-user", team=team)
        spec = {
            "kind": "service",
            "name": name,
            "team": team,
            "model": "sim-model",
            "engine": "simulated",
            "resources": {"cpus": 0.5},
            "replicas": {"min": 1, "max": 1},
            "engine_args": {"time-scale": time_scale},
        }
        r = api(cp, "POST", "/v1/services", json={"spec": spec})
        assert r.status_code == 201, r.text
    for team in teams:
        wait_for(
            lambda team=team: (
                api(cp, "GET", f"/v1/services/{name}", params={"team": team}).json()["ready"] == 1
            ),
            timeout=120,
            what=f"a ready replica of {team}/{name}",
        )
    return callers
