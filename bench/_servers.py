"""Processes the gateway benchmarks start, all on 127.0.0.1, and the client load loops.

- `start_engines`: simulated engines (bench/_engine_main.py), resettable to a cold state.
- `start_gateway` / `publish`: the real aicluster Gateway (bench/_gateway_main.py).
- `start_sglang_router`, `start_vllm_router`, `start_litellm`: peer routers from PyPI, each
  in its own virtual environment outside the project (see `PEER_VENVS`). Each returns a
  `Proc`, or a string that says why it cannot run here.
- `Proc.stop()` ends exactly the process it started, by PID.

Peer virtual environments (create once; never inside the project's .venv):
    python3 -m venv /tmp/peer-sglang  && /tmp/peer-sglang/bin/pip install sglang-router==0.3.2
    python3 -m venv /tmp/peer-vllm    && /tmp/peer-vllm/bin/pip install vllm-router==0.1.17
    python3 -m venv /tmp/peer-litellm && /tmp/peer-litellm/bin/pip install 'litellm[proxy]==1.108.7'
Other locations: AICLUSTER_BENCH_SGLANG_VENV, AICLUSTER_BENCH_VLLM_ROUTER_VENV,
AICLUSTER_BENCH_LITELLM_VENV.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
MODEL = "sim"
LITELLM_VERSION = "1.108.7"
PEER_VENVS = {
    "sglang": os.environ.get("AICLUSTER_BENCH_SGLANG_VENV", "/tmp/peer-sglang"),
    "vllm-router": os.environ.get("AICLUSTER_BENCH_VLLM_ROUTER_VENV", "/tmp/peer-vllm"),
    "litellm": os.environ.get("AICLUSTER_BENCH_LITELLM_VENV", "/tmp/peer-litellm"),
}
_LOGDIR = Path(tempfile.mkdtemp(prefix="aic-bench-gw-"))
_ALL: list[Proc] = []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    port: int
    log: Path
    extra: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()  # this PID only
            try:
                self.popen.wait(5)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)

    def log_tail(self, n: int = 6) -> str:
        try:
            lines = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(line.strip()[:160] for line in lines[-n:])


def stop_all() -> None:
    for p in reversed(_ALL):
        p.stop()
    _ALL.clear()


atexit.register(stop_all)


def _spawn(name: str, argv: list[str], port: int, env: dict | None = None) -> Proc:
    log = _LOGDIR / f"{name}.log"
    full_env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), **(env or {}))
    with open(log, "wb") as fh:
        popen = subprocess.Popen(
            argv,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=full_env,
            stdin=subprocess.DEVNULL,
            cwd=str(_LOGDIR),
        )
    proc = Proc(name, popen, port, log)
    _ALL.append(proc)
    return proc


def wait_ready(proc: Proc, path: str, timeout_s: float = 30.0) -> str | None:
    """None once `GET path` answers below 500; else why not (and the process is stopped)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            return f"exited with {proc.popen.returncode}: {proc.log_tail()}"
        try:
            if httpx.get(proc.url + path, timeout=1.0).status_code < 500:
                return None
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.stop()
    return f"not ready after {timeout_s:.0f}s: {proc.log_tail()}"


def _must(proc: Proc, path: str, timeout_s: float = 30.0) -> Proc:
    why = wait_ready(proc, path, timeout_s)
    if why is not None:
        raise RuntimeError(f"{proc.name} did not start: {why}")
    return proc


# -- aicluster's own processes -------------------------------------------------------------


def start_engines(n: int, options: dict) -> list[Proc]:
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
    procs = []
    for i in range(n):
        port = free_port()
        argv = [
            sys.executable,
            str(BENCH / "_engine_main.py"),
            f"--port={port}",
            f"--model={MODEL}",
            *flags,
        ]
        procs.append(_spawn(f"engine{i}", argv, port))
    return [_must(p, "/health") for p in procs]


def reset_engines(engines: list[Proc]) -> None:
    for e in engines:
        httpx.post(e.url + "/bench/reset", timeout=5.0).raise_for_status()


def start_gateway() -> Proc:
    port = free_port()
    argv = [sys.executable, str(BENCH / "_gateway_main.py"), f"--port={port}"]
    return _must(_spawn("gateway", argv, port), "/bench/health")


def start_gateway_processes(
    engines: list[Proc], routing: str, workers: int, http: str = "lean"
) -> tuple[Proc, dict]:
    """`aicluster gateway --workers N` (gateway.process) following a stand-in control plane
    (bench/_feed_stub.py) that points service `gwproc/sim` at `engines`; (the gateway, the
    headers its clients send)."""
    team = f"gwproc{workers}{http}"
    stub_port = free_port()
    stub_argv = [sys.executable, str(BENCH / "_feed_stub.py"), f"--port={stub_port}"]
    stub_argv += [f"--team={team}", f"--model={MODEL}", f"--routing={routing}"]
    stub_argv += [a for e in engines for a in ("--engine", e.url)]
    stub = _must(_spawn(f"feed-stub-{workers}", stub_argv, stub_port), "/bench/counts")
    port = free_port()
    argv = [sys.executable, "-m", "aicluster.gateway.process", "--control-plane", stub.url]
    argv += ["--port", str(port), "--workers", str(workers), "--http", http]
    env = {"AICLUSTER_GATEWAY_TOKEN": "bench-admin-token"}
    gw = _must(_spawn(f"gateway-process-{workers}-{http}", argv, port, env), "/healthz")
    return gw, {"authorization": f"Bearer bench-{team}"}


def publish(
    gateway: Proc,
    team: str,
    routing: str,
    engines: list[Proc],
    tag: str,
    routing_options: dict | None = None,
) -> dict[str, str]:
    """Point service `team/sim` at `engines`; returns the headers its clients send."""
    svc = {
        "team": team,
        "name": MODEL,
        "routing": routing,
        "routing_options": routing_options or {},
        "replicas": [{"id": f"{tag}-r{i}", "url": e.url} for i, e in enumerate(engines)],
    }
    httpx.post(gateway.url + "/bench/publish", json=[svc], timeout=5.0).raise_for_status()
    return {"authorization": f"Bearer bench-{team}"}


# -- peers ----------------------------------------------------------------------------------


def _venv_bin(peer: str, exe: str) -> str | Path:
    path = Path(PEER_VENVS[peer]) / "bin" / exe
    if not path.exists():
        return f"{path} not found (install it: see bench/_servers.py)"
    return path


def _router(
    peer: str, argv0: list[str], engines: list[Proc], policy: str, log_level: str, extra: list[str]
) -> Proc | str:
    port, prom = free_port(), free_port()
    argv = [
        *argv0,
        "--worker-urls",
        *[e.url for e in engines],
        "--policy",
        policy,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(prom),
        "--log-level",
        log_level,
        *extra,
    ]
    proc = _spawn(f"{peer}-{policy}-{port}", argv, port, env={"HF_HUB_OFFLINE": "1"})
    why = wait_ready(proc, "/health", 60.0)
    if why is None and _probe(proc.url, {}) is None:
        return proc
    proc.stop()
    return why or f"answers but cannot serve: {_probe(proc.url, {})}"


def start_sglang_router(engines: list[Proc], policy: str, extra: list[str] = ()) -> Proc | str:
    py = _venv_bin("sglang", "python")
    if isinstance(py, str):
        return py
    return _router(
        "sglang-router",
        [str(py), "-m", "sglang_router.launch_router"],
        engines,
        policy,
        "warn",
        list(extra),
    )


def start_vllm_router(engines: list[Proc], policy: str, extra: list[str] = ()) -> Proc | str:
    exe = _venv_bin("vllm-router", "vllm-router")
    if isinstance(exe, str):
        return exe
    return _router("vllm-router", [str(exe)], engines, policy, "warning", list(extra))


LITELLM_KEY = "sk-bench"


def start_litellm(engines: list[Proc]) -> Proc | str:
    exe = _venv_bin("litellm", "litellm")
    if isinstance(exe, str):
        return exe
    port = free_port()
    cfg = _LOGDIR / f"litellm-{port}.yaml"
    deployments = [
        {
            "model_name": MODEL,
            "litellm_params": {
                "model": f"openai/{MODEL}",
                "api_base": f"{e.url}/v1",
                "api_key": "none",
            },
        }
        for e in engines
    ]
    cfg.write_text(
        json.dumps(
            {
                "model_list": deployments,
                "general_settings": {"master_key": LITELLM_KEY},
                "router_settings": {"routing_strategy": "simple-shuffle"},
                "litellm_settings": {"drop_params": True},
            }
        )
    )  # JSON is YAML
    env = {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_LOG": "ERROR",
        "LITELLM_TELEMETRY": "False",
        "DISABLE_SCHEMA_UPDATE": "true",
    }
    argv = [
        str(exe),
        "--config",
        str(cfg),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        "1",
    ]
    proc = _spawn(f"litellm-{port}", argv, port, env=env)
    why = wait_ready(proc, "/health/liveliness", 120.0)
    headers = {"authorization": f"Bearer {LITELLM_KEY}"}
    if why is None and _probe(proc.url, headers) is None:
        return proc
    proc.stop()
    return why or f"answers but cannot serve: {_probe(proc.url, headers)}"


def _probe(url: str, headers: dict) -> str | None:
    """None when one chat completion through `url` succeeds; else what went wrong."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 2,
    }
    try:
        r = httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=30.0)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    if r.status_code != 200:
        return f"HTTP {r.status_code}: {r.text[:200]}"
    return None


# -- measuring ------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


async def scrape(client: httpx.AsyncClient, engines: list[Proc]) -> list[dict[str, float]]:
    """Per engine, the vLLM-style counters we read (sums over labels), from /metrics."""
    out = []
    for e in engines:
        text = (await client.get(e.url + "/metrics")).text
        vals: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("#") or " " not in line:
                continue
            name, _, value = line.rpartition(" ")
            base = name.split("{", 1)[0]
            vals[base] = vals.get(base, 0.0) + float(value)
        out.append(vals)
    return out


def cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs, from /proc/stat (Linux); (0, 0) elsewhere."""
    try:
        with open("/proc/stat") as f:
            vals = [float(v) for v in f.readline().split()[1:]]
    except OSError:
        return 0.0, 0.0
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0.0)
    return sum(vals) - idle, sum(vals)


def cpu_busy_since(start: tuple[float, float]) -> float:
    """Fraction of the machine's CPU time that was busy since `start` (a cpu_times())."""
    busy, total = cpu_times()
    return (busy - start[0]) / (total - start[1]) if total > start[1] else float("nan")


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    line = lambda r: "  ".join(
        str(x).rjust(w) if i else str(x).ljust(w) for i, (x, w) in enumerate(zip(r, widths))
    )
    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def run(coro):
    return asyncio.run(coro)
