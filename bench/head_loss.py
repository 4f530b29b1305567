"""Head-loss benchmark: what of a Ray cluster survives when its head machine dies and a
new head comes back on the same address, with Ray's GCS state kept in memory (Ray's
default), in an external Redis, or in RocksDB on a disk that outlives the head.

Run:   .venv/bin/python bench/head_loss.py                       (~2-3 min on 2 cores)
       .venv/bin/python bench/head_loss.py --modes redis --down 20
Options: --modes memory,redis,rocksdb (default all three), --down SECONDS (how long the
         head stays dead before the new one starts, default 5), --wait SECONDS (how long
         to wait for the old actor to answer again, default 90), --json FILE.
Needs redis-server for the redis mode (Debian's `redis-server` package; skipped when it
is missing).

Everything is private and on loopback: a head without CPUs and one 2-CPU worker node,
each started the way `aicluster up` / `aicluster join` start them (engine/raynode.py:
token auth, one AICLUSTER_HOME each, the worker given the head's Ray token); Redis on a
loopback port without persistence (it lives on another machine, so the head's loss does
not touch it); RocksDB in a folder of the head's home that is kept (a persistent volume).
Every process started is killed at the end, also on errors.

Per mode: a detached actor on the worker counts its own ticks in a thread; the head's
every process is killed with SIGKILL (a lost machine); after --down seconds a new head
starts on the same port with the same settings. Measured: the new head's start time;
whether the worker node is still alive in the new head's view; whether the *same* actor
process (pid) answers by name again, how long after the new head started, and whether it
kept counting through the outage (its state survived); whether new work can be placed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from aicluster.engine.rayenv import ensure_ray_token, ray_env, ray_temp_dir, ray_token_path
from aicluster.engine.raynode import installation_processes, join, kill_installation, start_head

# The driver: creates the probe actor, or finds it and asks it, and says what it saw.
PROBE = r"""
import json, os, sys, threading, time
import ray
address, action = sys.argv[1], sys.argv[2]
ray.init(address=address, namespace="headloss", logging_level="ERROR", log_to_driver=False)
out = {}
if action == "create":
    @ray.remote(num_cpus=1)
    class Probe:
        def __init__(self):
            self.ticks = 0
            threading.Thread(target=self._tick, daemon=True).start()
        def _tick(self):
            while True:
                time.sleep(0.1)
                self.ticks += 1
        def ask(self):
            return {"pid": os.getpid(), "ticks": self.ticks, "node": ray.get_runtime_context().get_node_id()}
    p = Probe.options(name="probe", lifetime="detached").remote()
    out = ray.get(p.ask.remote(), timeout=60)
elif action == "ask":
    try:
        p = ray.get_actor("probe")
        out = ray.get(p.ask.remote(), timeout=10)
    except Exception as e:
        out = {"error": type(e).__name__ + ": " + str(e).splitlines()[0][:200]}
    out["alive_nodes"] = sum(1 for n in ray.nodes() if n["Alive"])
elif action == "new_work":
    @ray.remote(num_cpus=1)
    def f():
        return os.getpid()
    try:
        out = {"pid": ray.get(f.remote(), timeout=30)}
    except Exception as e:
        out = {"error": type(e).__name__ + ": " + str(e).splitlines()[0][:200]}
print("PROBE " + json.dumps(out), flush=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def probe(head_home: Path, address: str, action: str, timeout: float = 60) -> dict:
    env = dict(os.environ)
    env.update(ray_env(head_home))
    try:
        proc = subprocess.run(
            [sys.executable, "-c", PROBE, address, action],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"the driver did not finish in {timeout:.0f} s"}
    for line in proc.stdout.splitlines():
        if line.startswith("PROBE "):
            return json.loads(line[6:])
    return {"error": f"driver exit {proc.returncode}: {proc.stderr.strip()[-300:]}"}


@contextmanager
def redis_server():
    port = _free_port()
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)


@contextmanager
def gcs_spec(mode: str, tmp: Path):
    """The `aicluster up --ray-gcs-state` value of `mode` (a Redis started for it)."""
    if mode == "redis":
        with redis_server() as addr:
            yield f"redis://{addr}"
    elif mode == "rocksdb":
        yield f"rocksdb:{tmp / 'gcs-rocksdb'}"
    else:
        yield "memory"


def kill_head(head_home: Path) -> int:
    """SIGKILL every process of the head's installation at once (a lost machine)."""
    procs = installation_processes(head_home)
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    return len(procs)


def run_mode(mode: str, down: float, wait: float) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix=f"headloss-{mode}-"))
    head_home, worker_home = tmp / "head", tmp / "worker"
    head_home.mkdir()
    worker_home.mkdir()
    ensure_ray_token(head_home)
    ray_token_path(worker_home).parent.mkdir(parents=True)
    shutil.copy(ray_token_path(head_home), ray_token_path(worker_home))
    row: dict = {"mode": mode}
    try:
        with gcs_spec(mode, tmp) as spec:
            row["gcs_state"] = spec
            port = _free_port()
            t = time.monotonic()
            address = start_head(head_home, port=port, num_cpus=0, gcs_state=spec)
            row["head_start_s"] = round(time.monotonic() - t, 2)
            join(worker_home, address, num_cpus=2)
            before = probe(head_home, address, "create")
            if "error" in before:
                raise RuntimeError(f"{mode}: the probe actor did not start: {before['error']}")
            row["killed_processes"] = kill_head(head_home)
            killed_at = time.monotonic()
            # The new head is a fresh machine: none of the old one's Ray session files.
            shutil.rmtree(ray_temp_dir(head_home), ignore_errors=True)
            time.sleep(down)  # the outage itself: the head stays dead this long
            t = time.monotonic()
            start_head(head_home, port=port, num_cpus=0, gcs_state=spec)
            restarted = time.monotonic()
            row["head_restart_s"] = round(restarted - t, 2)
            after: dict = {}
            while time.monotonic() - restarted < wait:
                after = probe(head_home, address, "ask", timeout=40)
                if "error" not in after or "Failed to look up actor" in after["error"]:
                    break
            row["answered_after_s"] = (
                round(time.monotonic() - restarted, 2) if "error" not in after else None
            )
            row["same_actor"] = after.get("pid") == before["pid"]
            outage_ticks = (restarted - killed_at) / 0.1
            row["kept_counting"] = (
                "error" not in after and after["ticks"] - before["ticks"] >= 0.8 * outage_ticks
            )
            row["alive_nodes_after"] = after.get("alive_nodes")
            row["actor_error"] = after.get("error")
            work = probe(head_home, address, "new_work", timeout=45)
            row["new_work"] = "error" not in work
            row["new_work_error"] = work.get("error")
    finally:
        for home in (head_home, worker_home):
            kill_installation(home, grace=2)
        shutil.rmtree(tmp, ignore_errors=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default="memory,redis,rocksdb")
    ap.add_argument("--down", type=float, default=5.0)
    ap.add_argument("--wait", type=float, default=90.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in ("memory", "redis", "rocksdb"):
            ap.error(f"--modes: unknown mode {m!r} (memory, redis, rocksdb)")
    rows = []
    for mode in modes:
        if mode == "redis" and shutil.which("redis-server") is None:
            print("redis: skipped (no redis-server; apt-get install redis-server)")
            continue
        print(f"{mode}: running (head down {args.down:g} s) ...", flush=True)
        rows.append(run_mode(mode, args.down, args.wait))
        print("  " + json.dumps(rows[-1]), flush=True)
    print()
    print(f"head killed (SIGKILL, every process), down {args.down:g} s, restarted on the same port")
    print(
        "| GCS state | head restart | old actor answers after | same process | kept counting | nodes alive | new work |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        ans = f"{r['answered_after_s']} s" if r["answered_after_s"] is not None else "never (lost)"
        print(
            f"| {r['mode']} | {r['head_restart_s']} s | {ans} | {r['same_actor']} | {r['kept_counting']} "
            f"| {r['alive_nodes_after']} | {r['new_work']} |"
        )
    base = next((r for r in rows if r["mode"] == "memory"), None)
    for r in rows:
        if base is not None and r is not base and r["answered_after_s"] is not None:
            print(
                f"{r['mode']}: the running actor survived; with memory (the default) it was "
                f"{'lost' if base['answered_after_s'] is None else 'kept'}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
