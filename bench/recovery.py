"""Recovery benchmark: a node dying under a checkpointing 2-node DDP job, and a service
replica dying under load.

Run:   .venv/bin/python bench/recovery.py            (full: ~1.5 min on an idle 2-core machine,
                                                      ~2-3 min on a busy one)
       .venv/bin/python bench/recovery.py --quick    (shorter job and load: ~1-2 min)
Options: --only jobs|services, --steps, --checkpoint-every, --requests, --concurrency,
         --default-health-checks (Ray's own node health checks, as `aicluster up` runs them,
         instead of the tests' fast ones), --json FILE (the figures as JSON), --deadline
         SECONDS (hard bound, default 900), --keep (keep the temp home and its logs).

Everything is private and on loopback: a temp AICLUSTER_HOME, its own Ray cluster made
with ray.cluster_utils.Cluster (a head without CPUs whose health checks declare a killed
node dead in ~1.5 s, tests/harness.py's FAST_NODE_DEATH; with --default-health-checks
Ray's defaults, ~15 s; plus 3 worker nodes of 2 CPUs and 1 declared A100 each), and the real
control plane (`python -m aicluster.api.server`) as its own process, as in tests/harness.py.
Every process it started is stopped at the end, also on errors and on --deadline.

1. Node death. The DDP example (examples/ddp-train, copied, with its command pointed at
   this interpreter) runs as 2 workers x 1 A100, max_restarts 1, checkpointing every
   --checkpoint-every steps. A clean run gives the baseline wall time and step rate. In a
   second run, once a checkpoint is saved and the job is half a checkpoint interval past it,
   the node of rank 1 dies: SIGKILL of its whole process tree (raylet, Ray workers and the
   job's processes under them), then `cluster.remove_node(node, allow_graceful=False)`
   (alone, that leaves the node's worker processes running for a while). Measured
   from the kill: Ray/the control plane noticing (NodeLost event), the job requeued, the
   job RUNNING again (event timestamp; the control plane's own "recovered X s" message is
   shown too), and the first `step` line after `resumed from step S` as seen by a client
   polling attempt 2's log; work lost = last step logged before the death - S (steps, and
   seconds at the clean run's step rate); the final status and that both ranks (and the
   clean run) end with the same parameters hash. Failure cost = failed-run wall time -
   clean-run wall time (both from the job's created_at / finished_at), and, free of the
   noise between two runs, kill -> attempt 2 back at the last step logged before the kill.

2. Replica death. A `simulated` service with 3 replicas takes a bounded load (--requests
   at --concurrency through the gateway, async httpx, non-streaming completions) twice:
   once undisturbed (baseline), once with one replica's engine process killed with
   SIGKILL after 30% of the requests. Reported: failed requests, p50/p99 latency before,
   across and after the kill against the baseline, and the time from the kill to the
   victim marked FAILED and to a replacement replica READY.

Figures are wall-clock on whatever else the machine is running: the load average is
printed with them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))  # harness.py: the same real parts the tests use

from aicluster.engine.rayenv import ray_env, ray_temp_dir

STEP_RE = re.compile(r"^step (\d+) loss ")
CKPT_RE = re.compile(r"^checkpoint saved step (\d+) ")
RESUMED_RE = re.compile(r"^resumed from step (\d+)")
FINAL_RE = re.compile(r"^final step (\d+) rank (\d+) params_sha256 ([0-9a-f]+)")
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
GPU_MODEL = "A100"
POLL_S = 0.1


class BenchError(RuntimeError):
    pass


class DeadlineReached(BaseException):  # not an Exception: no `except Exception` swallows it
    pass


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def fmt(v, spec: str = ".2f", unit: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{unit}"


def table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    print(f"\n{title}\n")
    line = "  ".join(
        f"{h:<{w}}" if i == 0 else f"{h:>{w}}" for i, (h, w) in enumerate(zip(header, widths))
    )
    print(line)
    print("-" * len(line))
    for r in rows:
        print(
            "  ".join(
                f"{c!s:<{w}}" if i == 0 else f"{c!s:>{w}}"
                for i, (c, w) in enumerate(zip(r, widths))
            )
        )


# --------------------------------------------------------------------------- logs


class LogWatcher:
    """Polls one rank's log of one attempt; stamps each complete line with the client's time."""

    def __init__(self, client, job_id: str, rank: int, attempt: int):
        self.client, self.job_id, self.rank, self.attempt = client, job_id, rank, attempt
        self.offset, self.partial = 0, b""
        self.lines: list[tuple[float, str]] = []

    def poll(self) -> list[tuple[float, str]]:
        from aicluster.client.api import ApiError

        new: list[tuple[float, str]] = []
        while True:
            try:
                data, nxt, _, got = self.client.logs(
                    self.job_id, self.rank, self.attempt, self.offset
                )
            except ApiError:
                return new  # the attempt has no log yet
            if not data or got != self.attempt:
                break
            now = time.time()
            self.offset = nxt
            *complete, self.partial = (self.partial + data).split(b"\n")
            for raw in complete:
                new.append((now, raw.decode("utf-8", "replace")))
        self.lines += new
        return new

    def matches(self, rx: re.Pattern) -> list[tuple[float, re.Match]]:
        return [(t, m) for t, line in self.lines if (m := rx.match(line))]


def read_all(client, job_id: str, rank: int, attempt: int) -> str:
    w = LogWatcher(client, job_id, rank, attempt)
    w.poll()
    return "\n".join(line for _, line in w.lines) + w.partial.decode("utf-8", "replace")


def final_hashes(client, job: dict) -> dict[int, str]:
    out = {}
    for rank in range(job["workers"]):
        for line in read_all(client, job["id"], rank, job["attempt"]).splitlines():
            if m := FINAL_RE.match(line):
                out[int(m[2])] = m[3]
    return out


def step_rate(points: list[tuple[float, int]]) -> float | None:
    """Steps per second from (client time, step) samples, by least squares."""
    if len(points) < 3 or points[-1][0] - points[0][0] < 1.0:
        return None
    ts, ss = [p[0] for p in points], [p[1] for p in points]
    mt, ms = statistics.fmean(ts), statistics.fmean(ss)
    num = sum((t - mt) * (s - ms) for t, s in zip(ts, ss))
    den = sum((t - mt) ** 2 for t in ts)
    return num / den if den > 0 else None


# --------------------------------------------------------------------------- part 1: node death


def write_job(workdir: Path, name: str, steps: int, every: int) -> Path:
    path = workdir / f"{name}.yaml"
    cmd = f"{sys.executable} train.py --steps {steps} --checkpoint-every {every}"
    path.write_text(
        f"kind: job\nname: {name}\nteam: default\nworkers: 2\n"
        f"resources:\n  cpus: 1\n  gpus: 1\n  gpu_model: {GPU_MODEL}\n"
        f"command: {cmd}\nworking_dir: .\nmax_restarts: 1\n"
    )
    return path


def kill_node(cluster, node) -> int:
    """A machine dying: SIGKILL every process of the node at once, the Ray worker processes
    and the job's own processes under them included, then drop it from `cluster`.

    `cluster.remove_node(allow_graceful=False)` alone kills only the node's Ray daemons
    (raylet, agents); the worker processes under the raylet and the command they run live
    on until they notice, and a DDP rank there keeps training (and its peers keep saving
    checkpoints) for ~1.5 s after the "death". Returns how many processes were killed.
    """
    import psutil

    roots = [
        info.process.pid
        for infos in node.all_processes.values()
        for info in infos
        if info.process is not None
    ]
    procs: dict[int, psutil.Process] = {}
    for pid in roots:
        try:
            p = psutil.Process(pid)
            procs[pid] = p
            procs.update({c.pid: c for c in p.children(recursive=True)})
        except psutil.NoSuchProcess:
            continue
    for p in procs.values():
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    cluster.remove_node(node, allow_graceful=False)
    return len(procs)


def event_ts(events: list[dict], pred) -> dict | None:
    return next((e for e in events if pred(e)), None)


def clean_run(client, spec_path: Path, timeout: float, submitted: list) -> dict:
    job = client.submit_file(spec_path)
    submitted.append(job["id"])
    watch = LogWatcher(client, job["id"], 0, 1)
    deadline = time.time() + timeout
    while (job := client.job(job["id"]))["status"] not in TERMINAL:
        if time.time() > deadline:
            raise BenchError(f"clean run still {job['status']} after {timeout:.0f}s")
        watch.poll()
        time.sleep(POLL_S)
    watch.poll()
    steps = [(t, int(m[1])) for t, m in watch.matches(STEP_RE)]
    running = event_ts(job["events"], lambda e: e["to_status"] == "RUNNING")
    return {
        "job": job["id"],
        "status": job["status"],
        "attempts": job["attempt"],
        "wall_s": job["finished_at"] - job["created_at"],
        "submit_to_running_s": running["ts"] - job["created_at"] if running else None,
        "running_to_first_step_s": steps[0][0] - running["ts"] if (running and steps) else None,
        "step_rate": step_rate(steps),
        "hashes": final_hashes(client, job),
    }


def failure_run(
    client, cluster, spec_path: Path, steps: int, every: int, timeout: float, submitted: list
) -> dict:
    job = client.submit_file(spec_path)
    submitted.append(job["id"])
    jid = job["id"]
    # Kill half-way between two checkpoints, ~40% into the run.
    k = max(1, round(0.4 * steps / every))
    kill_at = k * every + every // 2
    w1 = LogWatcher(client, jid, 0, 1)
    deadline = time.time() + timeout
    while True:
        if time.time() > deadline:
            raise BenchError(f"the job never reached step {kill_at} before the kill")
        w1.poll()
        job = client.job(jid)
        if job["status"] in TERMINAL:
            raise BenchError(f"the job ended ({job['status']}) before the kill: raise --steps")
        seen = [int(m[1]) for _, m in w1.matches(STEP_RE)]
        ckpts = [int(m[1]) for _, m in w1.matches(CKPT_RE)]
        if job["status"] == "RUNNING" and ckpts and seen and seen[-1] >= kill_at:
            break
        time.sleep(POLL_S)
    placement = job["placement"]
    victim_id = placement[1]
    nodes = {n.node_id: n for n in cluster.worker_nodes}
    if victim_id not in nodes:
        raise BenchError(f"rank 1's node {victim_id[:8]} is not one of this cluster's workers")
    if placement[0] == victim_id:
        raise BenchError("both ranks on one node: the kill would take the whole job")
    seen_at_kill = seen[-1]
    t_kill = time.time()
    killed = kill_node(cluster, nodes[victim_id])
    t_removed = time.time()
    log(
        f"killed node {victim_id[:8]} (rank 1, {killed} processes) at logged step "
        f"{seen_at_kill}; took {t_removed - t_kill:.2f}s"
    )

    # Attempt 2: first `step` line after `resumed from step S`, as the client sees it.
    w2 = LogWatcher(client, jid, 0, 2)
    resumed = first_step = None
    while True:
        if time.time() > deadline:
            raise BenchError(
                f"no step after the resume within {timeout:.0f}s; job: "
                f"{job['status']} {job['reason']} {job['message']}"
            )
        job = client.job(jid)
        if job["attempt"] >= 2:
            for t, line in w2.poll():
                if resumed is None and (m := RESUMED_RE.match(line)):
                    resumed = (t, int(m[1]))
                elif resumed is not None and first_step is None and (m := STEP_RE.match(line)):
                    first_step = (t, int(m[1]))
        if first_step is not None:
            break
        if job["status"] in TERMINAL:
            break  # reported below (e.g. FAILED instead of requeued)
        time.sleep(POLL_S)
    while (job := client.job(jid))["status"] not in TERMINAL:
        if time.time() > deadline:
            raise BenchError(f"the recovered job is still {job['status']} after {timeout:.0f}s")
        w2.poll()
        time.sleep(POLL_S)
    w2.poll()

    ev = job["events"]
    node_lost = event_ts(
        client.events(object_id=victim_id),
        lambda e: e["type"] == "NodeLost" and e["object_id"] == victim_id,
    )
    requeued = event_ts(ev, lambda e: e["reason"] == "requeued")
    admitted2 = event_ts(
        ev, lambda e: e["to_status"] == "ADMITTED" and requeued and e["ts"] > requeued["ts"]
    )
    running2 = event_ts(
        ev, lambda e: e["to_status"] == "RUNNING" and (e["message"] or "").startswith("recovered")
    )
    steps1 = [int(m[1]) for _, m in w1.matches(STEP_RE)]
    w1.poll()  # whatever attempt 1 logged up to its end
    steps1 = [int(m[1]) for _, m in w1.matches(STEP_RE)] or steps1
    ckpt1 = [int(m[1]) for _, m in w1.matches(CKPT_RE)]
    last_before = max(steps1) if steps1 else None
    s = resumed[1] if resumed else None
    rate_pts = [(t, int(m[1])) for t, m in w2.matches(STEP_RE)]
    regained = next(
        (t for t, st in rate_pts if last_before is not None and st >= last_before), None
    )
    return {
        "job": jid,
        "status": job["status"],
        "reason": job["reason"],
        "attempts": job["attempt"],
        "restarts": job["restarts"],
        "victim_node": victim_id,
        "killed_at_logged_step": seen_at_kill,
        "kill_s": t_removed - t_kill,
        "killed_processes": killed,
        "node_lost_s": node_lost["ts"] - t_kill if node_lost else None,
        "requeued_s": requeued["ts"] - t_kill if requeued else None,
        "requeue_message": requeued["message"] if requeued else None,
        "admitted_s": admitted2["ts"] - t_kill if admitted2 else None,
        "running_s": running2["ts"] - t_kill if running2 else None,
        "running_message": running2["message"] if running2 else None,
        "resumed_seen_s": resumed[0] - t_kill if resumed else None,
        "first_step_seen_s": first_step[0] - t_kill if first_step else None,
        "first_step": first_step[1] if first_step else None,
        "regained_seen_s": regained - t_kill if regained else None,
        "resumed_from": s,
        "last_checkpoint_before": max(ckpt1) if ckpt1 else None,
        "last_step_before": last_before,
        "work_lost_steps": last_before - s if (last_before is not None and s is not None) else None,
        "wall_s": job["finished_at"] - job["created_at"] if job["finished_at"] else None,
        "step_rate_after": step_rate(rate_pts),
        "hashes": final_hashes(client, job) if job["status"] == "SUCCEEDED" else {},
        "placements": [e["message"] for e in ev if e["to_status"] == "ADMITTED"],
    }


def report_node(clean: dict, fail: dict, steps: int, every: int) -> None:
    rate = clean["step_rate"] or fail["step_rate_after"]
    lost_s = (
        fail["work_lost_steps"] / rate if (rate and fail["work_lost_steps"] is not None) else None
    )
    rows = [
        ["Ray/control plane: node dead (NodeLost event)", fmt(fail["node_lost_s"], ".2f", " s")],
        ["job requeued (attempt 1 ended node_lost)", fmt(fail["requeued_s"], ".2f", " s")],
        ["attempt 2 admitted (placed on healthy nodes)", fmt(fail["admitted_s"], ".2f", " s")],
        ["job RUNNING again (event)", fmt(fail["running_s"], ".2f", " s")],
        ["'resumed from step S' seen by the client", fmt(fail["resumed_seen_s"], ".2f", " s")],
        [
            "first step after the resume seen by the client",
            fmt(fail["first_step_seen_s"], ".2f", " s"),
        ],
        [
            f"back at the last step logged before the kill ({fmt(fail['last_step_before'], 'd')})",
            fmt(fail["regained_seen_s"], ".2f", " s"),
        ],
    ]
    table(
        "node death -> recovery, seconds after the kill (client and control-plane clocks: "
        "one machine)",
        ["milestone", "after kill"],
        rows,
    )
    if fail["running_message"]:
        print(f'control plane\'s own figure: "{fail["running_message"]}"')
    rows = [
        ["steps / checkpoint every", f"{steps} / {every}"],
        ["last checkpoint saved before the kill", fmt(fail["last_checkpoint_before"], "d")],
        ["last step logged before the kill (every 10)", fmt(fail["last_step_before"], "d")],
        ["resumed from step S", fmt(fail["resumed_from"], "d")],
        [
            "work lost",
            (
                f"{fmt(fail['work_lost_steps'], 'd')} steps = {fmt(lost_s, '.2f')} s"
                f" at {fmt(rate, '.0f')} steps/s"
            ),
        ],
        [
            "step rate clean / after resume",
            f"{fmt(clean['step_rate'], '.0f')} / {fmt(fail['step_rate_after'], '.0f')} steps/s",
        ],
    ]
    table("work lost", ["", "value"], rows)
    f = fail

    def span(a, b):
        return fmt(f[b] - f[a] if f[a] is not None and f[b] is not None else None, ".2f", " s")

    rows = [
        [
            "detection: kill -> attempt 1 ended node_lost, requeued",
            fmt(f["requeued_s"], ".2f", " s"),
            "-",
        ],
        [
            "relaunch: requeued -> RUNNING on healthy nodes",
            span("requeued_s", "running_s"),
            fmt(clean["submit_to_running_s"], ".2f", " s (submit -> RUNNING)"),
        ],
        [
            "start-up: RUNNING -> first step line seen (torch, gloo, checkpoint load)",
            span("running_s", "first_step_seen_s"),
            fmt(clean["running_to_first_step_s"], ".2f", " s"),
        ],
        [
            "replay: first step -> back at the pre-kill step",
            span("first_step_seen_s", "regained_seen_s"),
            "-",
        ],
        ["total: kill -> back at the pre-kill step", fmt(f["regained_seen_s"], ".2f", " s"), "-"],
    ]
    table("where the recovery time goes", ["phase", "node killed", "clean run"], rows)
    fh, ch = fail["hashes"], clean["hashes"]
    same_ranks = len(set(fh.values())) == 1 and len(fh) == 2
    same_clean = same_ranks and set(fh.values()) == set(ch.values())
    cost = fail["wall_s"] - clean["wall_s"] if (fail["wall_s"] and clean["wall_s"]) else None
    rows = [
        [
            "clean run",
            clean["status"],
            str(clean["attempts"]),
            fmt(clean["wall_s"], ".1f", " s"),
            (next(iter(ch.values()))[:12] if ch else "-"),
        ],
        [
            "node killed",
            f"{fail['status']} ({fail['reason']})",
            str(fail["attempts"]),
            fmt(fail["wall_s"], ".1f", " s"),
            (next(iter(fh.values()))[:12] if fh else "-"),
        ],
    ]
    table("outcome", ["run", "status", "attempts", "submit->end", "params_sha256"], rows)
    print(
        f"\nfailure cost = failed-run time - clean-run time = {fmt(cost, '.1f', ' s')}"
        f"  ({fmt(fail['wall_s'] / clean['wall_s'] if cost is not None else None, '.2f', 'x')})"
    )
    print(
        f"failure cost = kill -> back at the pre-kill step = {fmt(fail['regained_seen_s'], '.1f', ' s')}"
        "  (the delay the failure put on the job; the line above also carries the noise of "
        "two runs on a shared machine)"
    )
    print(f"params hash: ranks equal {same_ranks}; equal to the clean run {same_clean}")
    print(f"requeue event: {fail['requeue_message']!r}")


# --------------------------------------------------------------------------- part 2: replica death


def service_spec(name: str, replicas: int) -> dict:
    return {
        "kind": "service",
        "name": name,
        "model": "sim-model",
        "engine": "simulated",
        "resources": {"cpus": 0.5},
        "replicas": {"min": replicas, "max": replicas},
        "readiness_timeout_s": 120,
    }


async def load(url: str, token: str, model: str, n: int, conc: int, kill=None) -> dict:
    """n completions at fixed concurrency; `kill()` runs once 30% of them are done."""
    import httpx

    results: list[tuple[float, float, int, str]] = []
    counter = iter(range(n))
    done = 0
    kill_t: list[float] = []
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60, limits=limits) as http:

        async def worker():
            nonlocal done
            for i in counter:
                body = {"model": model, "prompt": f"request {i} about recovery", "max_tokens": 16}
                t0 = time.time()
                try:
                    r = await http.post("/v1/completions", json=body)
                    status, err = r.status_code, ("" if r.status_code == 200 else r.text[:200])
                except httpx.HTTPError as exc:
                    status, err = 0, f"{type(exc).__name__}: {exc}"
                results.append((t0, time.time(), status, err))
                done += 1
                if kill is not None and not kill_t and done >= int(0.3 * n):
                    kill_t.append(time.time())
                    kill()

        t_start = time.time()
        await asyncio.gather(*(worker() for _ in range(conc)))
        t_end = time.time()
    return {"results": results, "kill_t": kill_t[0] if kill_t else None, "wall_s": t_end - t_start}


def engine_pid(replica: dict) -> int:
    import psutil

    port = int(replica["url"].rsplit(":", 1)[1])
    pids = [
        c.pid
        for c in psutil.net_connections("tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.pid
    ]
    if not pids:
        raise BenchError(f"no process listens on replica {replica['id'][:8]}'s port {port}")
    return pids[0]


def gateway_outcomes(cp, service: str) -> dict[tuple[str, str], float]:
    """(replica, code) -> count of the gateway's upstream attempts for `service` (/metrics)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(
        cp.url + "/metrics", headers={"Authorization": f"Bearer {cp.admin_token}"}, timeout=30
    ).text
    out: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != "aicluster_gateway_requests":
            continue
        for smp in fam.samples:
            if smp.name.endswith("_total") and smp.labels.get("service") == service:
                key = (smp.labels["replica"], smp.labels["code"])
                out[key] = out.get(key, 0) + smp.value
    return out


def replica_run(client, cp, name: str, n: int, conc: int) -> dict:
    from harness import wait_for

    client.deploy(service_spec(name, 3))
    t0 = time.time()
    wait_for(
        lambda: client.service(name)["ready"] == 3,
        timeout=180,
        interval=0.25,
        what="3 ready replicas",
    )
    log(f"3 replicas READY after {time.time() - t0:.1f}s")
    token = cp.admin_token

    def run(kill=None):
        return asyncio.run(load(cp.url, token, name, n, conc, kill))

    run_warm = asyncio.run(load(cp.url, token, name, min(40, n), conc))
    if any(s != 200 for *_, s, _ in run_warm["results"]):
        raise BenchError(
            "warm-up requests failed: " + next(e for *_, s, e in run_warm["results"] if s != 200)
        )
    base = run()
    log(f"baseline load: {n} requests in {base['wall_s']:.1f}s")

    svc = client.service(name)
    before_ids = {r["id"] for r in svc["replicas"]}
    victim = next(r for r in svc["replicas"] if r["status"] == "READY")
    pid = engine_pid(victim)
    watch: dict = {}
    stop = threading.Event()

    def watcher():  # client-seen times of the victim FAILED and a new replica READY
        own = cp.client()  # its own connection pool: this runs in a thread
        while not stop.is_set():
            try:
                reps = own.service(name)["replicas"]
            except Exception:  # noqa: BLE001 - keep polling
                reps = []
            now = time.time()
            for r in reps:
                if (
                    r["id"] == victim["id"]
                    and r["status"] != "READY"
                    and "victim_seen" not in watch
                ):
                    watch["victim_seen"], watch["victim"] = now, r
                if r["id"] not in before_ids and r["status"] == "READY" and "new_seen" not in watch:
                    watch["new_seen"], watch["new"] = now, r
            if "victim_seen" in watch and "new_seen" in watch:
                return
            time.sleep(0.2)

    def kill():
        os.kill(pid, signal.SIGKILL)
        threading.Thread(target=watcher, daemon=True).start()

    counts_before = gateway_outcomes(cp, name)
    hit = run(kill)
    counts_after = gateway_outcomes(cp, name)
    retried = {
        k: v - counts_before.get(k, 0)
        for k, v in counts_after.items()
        if k[1] not in ("200", "400", "404") and v - counts_before.get(k, 0) > 0
    }
    log(f"load with a kill: {n} requests in {hit['wall_s']:.1f}s; waiting for the replacement")
    t_kill = hit["kill_t"]
    try:
        wait_for(
            lambda: "new_seen" in watch and "victim_seen" in watch,
            timeout=180,
            interval=0.2,
            what="the victim FAILED and a replacement READY",
        )
    finally:
        stop.set()
    final = client.service(name)
    client.delete_service(name)
    return {
        "base": base,
        "hit": hit,
        "t_kill": t_kill,
        "victim": victim,
        "watch": watch,
        "final_ready": final["ready"],
        "final_replicas": final["replicas"],
        "failed_upstream_attempts": {f"{r} {c}": v for (r, c), v in retried.items()},
    }


def report_replica(r: dict, n: int, conc: int) -> None:
    t_kill = r["t_kill"]
    base = r["base"]["results"]
    hit = r["hit"]["results"]

    def lat(rs):
        return [(t1 - t0) * 1e3 for t0, t1, s, _ in rs if s == 200]

    groups = [
        ("baseline (no kill)", base),
        ("kill run: all", hit),
        ("  ended before the kill", [x for x in hit if x[1] <= t_kill]),
        ("  in flight at the kill", [x for x in hit if x[0] < t_kill < x[1]]),
        ("  started after the kill", [x for x in hit if x[0] >= t_kill]),
    ]
    b50, b99 = pct(lat(base), 0.5), pct(lat(base), 0.99)
    rows = []
    for label, rs in groups:
        ls = lat(rs)
        p50, p99 = pct(ls, 0.5), pct(ls, 0.99)
        rows.append(
            [
                label,
                str(len(rs)),
                str(sum(1 for x in rs if x[2] != 200)),
                fmt(p50, ".0f"),
                fmt(p99, ".0f"),
                fmt(max(ls) if ls else None, ".0f"),
                fmt(p50 / b50 if p50 and b50 else None, ".2f", "x"),
                fmt(p99 / b99 if p99 and b99 else None, ".2f", "x"),
            ]
        )
    table(
        f"replica killed (SIGKILL, engine process) under load: {n} requests, concurrency {conc}, "
        f"3 replicas, max_tokens 16",
        ["requests", "n", "failed", "p50 ms", "p99 ms", "max ms", "p50/base", "p99/base"],
        rows,
    )
    print(
        "gateway upstream attempts that failed during the kill run (each retried on another "
        f"replica when it failed before the first byte): {r['failed_upstream_attempts'] or 'none'}"
    )
    errors = [e for *_, s, e in hit if s != 200]
    if errors:
        print(f"first error: {errors[0]}")
    w = r["watch"]
    final = {x["id"]: x for x in r["final_replicas"]}
    victim = final.get(r["victim"]["id"], w.get("victim", {}))
    new = final.get(w.get("new", {}).get("id"), w.get("new", {}))
    rows = [
        [
            "victim marked " + str(victim.get("status")) + " (server finished_at)",
            fmt(victim["finished_at"] - t_kill if victim.get("finished_at") else None, ".2f", " s"),
        ],
        [
            "victim not READY, seen by the client",
            fmt(w["victim_seen"] - t_kill if "victim_seen" in w else None, ".2f", " s"),
        ],
        [
            "replacement READY (server ready_at)",
            fmt(new["ready_at"] - t_kill if new.get("ready_at") else None, ".2f", " s"),
        ],
        [
            "replacement READY, seen by the client",
            fmt(w["new_seen"] - t_kill if "new_seen" in w else None, ".2f", " s"),
        ],
        [
            "replacement created (server created_at)",
            fmt(new["created_at"] - t_kill if new.get("created_at") else None, ".2f", " s"),
        ],
    ]
    table("replica death -> replacement, seconds after the kill", ["milestone", "after kill"], rows)
    print(
        f"victim message: {victim.get('reason')!r} {victim.get('message')!r}; "
        f"throughput baseline {len(base) / r['base']['wall_s']:.0f} req/s, "
        f"kill run {len(hit) / r['hit']['wall_s']:.0f} req/s; ready at the end: {r['final_ready']}"
    )


# --------------------------------------------------------------------------- main


def start_cluster(workers: int = 3, fast_node_death: bool = True):
    from ray.cluster_utils import Cluster

    from aicluster.engine.protocol import GPU_MODEL_LABEL, POOL_LABEL

    from harness import COMMON_NODE_ARGS, FAST_NODE_DEATH

    cluster = Cluster(
        initialize_head=True,
        connect=False,
        head_node_args=dict(
            num_cpus=0,
            num_gpus=0,
            labels={POOL_LABEL: "system"},
            _system_config=FAST_NODE_DEATH if fast_node_death else {},
            **COMMON_NODE_ARGS,
        ),
    )
    for i in range(workers):
        labels = {POOL_LABEL: "gpu", GPU_MODEL_LABEL: GPU_MODEL, "rack": f"r{i}"}
        cluster.add_node(num_cpus=2, num_gpus=1, labels=labels, **COMMON_NODE_ARGS)
    cluster.wait_for_nodes()
    return cluster


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="shorter job and load")
    ap.add_argument("--only", choices=("jobs", "services"), help="run one part only")
    ap.add_argument("--steps", type=int, help="DDP steps (default 6000, quick 2500)")
    ap.add_argument("--checkpoint-every", type=int, help="default 500, quick 250")
    ap.add_argument("--requests", type=int, help="requests per load run (default 600, quick 240)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument(
        "--default-health-checks",
        action="store_true",
        help="Ray's default node health checks (what `aicluster up` runs) instead of "
        "the tests' FAST_NODE_DEATH",
    )
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--deadline", type=int, default=900, help="hard bound on the whole run (s)")
    ap.add_argument("--keep", action="store_true", help="keep the temp home (logs) afterwards")
    args = ap.parse_args()
    steps = args.steps or (2500 if args.quick else 6000)
    every = args.checkpoint_every or (250 if args.quick else 500)
    n_req = args.requests or (240 if args.quick else 600)
    if every >= steps:
        ap.error("--checkpoint-every must be below --steps")

    home = Path(tempfile.mkdtemp(prefix="aic-recovery-"))
    ray_home = home / "ray-session"
    os.environ.update(ray_env(ray_home))  # before `import ray`; never an outer installation's

    def on_alarm(*_):
        raise DeadlineReached(f"--deadline {args.deadline}s reached")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(args.deadline)

    from aicluster.client.api import ApiError
    from aicluster.engine.raynode import kill_installation

    from harness import ControlPlaneProc, free_port

    print(
        f"recovery benchmark: home {home}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; "
        f"node health checks: {'Ray defaults' if args.default_health_checks else 'FAST_NODE_DEATH'}"
    )
    cluster = cp = None
    submitted: list[str] = []  # job ids, for the scratch clean-up
    out: dict = {"quick": args.quick, "steps": steps, "checkpoint_every": every}
    t0 = time.time()
    try:
        log("starting Ray (head + 3 worker nodes)")
        cluster = start_cluster(fast_node_death=not args.default_health_checks)
        log(f"Ray up after {time.time() - t0:.1f}s; starting the control plane")
        cp = ControlPlaneProc(home / "cp", cluster.address, free_port())
        cp.start()
        client = cp.client()
        from harness import wait_for

        wait_for(
            lambda: (
                sum(1 for n in client.nodes() if n["alive"] and n["gpu_model"] == GPU_MODEL) == 3
            ),
            timeout=60,
            what="3 GPU nodes in the control plane",
        )

        if args.only in (None, "jobs"):
            work = home / "ddp-train"
            work.mkdir()
            shutil.copy(ROOT / "examples" / "ddp-train" / "train.py", work / "train.py")
            tag = os.urandom(2).hex()
            clean_yaml = write_job(work, f"ddp-clean-{tag}", steps, every)
            fail_yaml = write_job(work, f"ddp-fail-{tag}", steps, every)
            log(f"clean DDP run: {steps} steps, checkpoint every {every}")
            clean = clean_run(client, clean_yaml, timeout=300, submitted=submitted)
            log(
                f"clean run {clean['status']} in {clean['wall_s']:.1f}s "
                f"({fmt(clean['step_rate'], '.0f')} steps/s)"
            )
            if clean["status"] != "SUCCEEDED":
                raise BenchError(f"clean run {clean['status']}; see {home}/cp/logs")
            log("DDP run with rank 1's node killed")
            fail = failure_run(
                client, cluster, fail_yaml, steps, every, timeout=300, submitted=submitted
            )
            out["node_death"] = {"clean": clean, "failure": fail}
            report_node(clean, fail, steps, every)

        if args.only in (None, "services"):
            log(
                f"service: 3 simulated replicas, {n_req} requests at concurrency {args.concurrency}"
            )
            rep = replica_run(client, cp, f"sim-{os.urandom(2).hex()}", n_req, args.concurrency)
            report_replica(rep, n_req, args.concurrency)
            res = {
                k: rep[k]
                for k in ("t_kill", "victim", "watch", "final_ready", "failed_upstream_attempts")
            }
            for k in ("base", "hit"):
                res[k] = {"wall_s": rep[k]["wall_s"], "results": rep[k]["results"]}
            out["replica_death"] = res
        print(f"\ntotal {time.time() - t0:.0f}s; load average now {os.getloadavg()[0]:.1f}")
        if args.json:
            args.json.write_text(json.dumps(out, indent=1, default=str))
        return 0
    except (BenchError, TimeoutError, ApiError, DeadlineReached) as exc:
        print(
            f"\nrecovery benchmark failed: {exc}\n(control plane log: {home}/cp/controlplane.log)",
            file=sys.stderr,
        )
        args.keep = True
        return 1
    finally:
        signal.alarm(0)
        if cp is not None:
            cp.stop()
        if cluster is not None:
            try:
                cluster.shutdown()
            except Exception as exc:  # noqa: BLE001 - the sweep below still runs
                log(f"cluster.shutdown: {exc}")
        kill_installation(ray_home)  # anything of this run still alive (same RAY_TMPDIR)
        # A killed node cannot clean its workers' scratch folders: do it for it.
        scratch = Path(tempfile.gettempdir()) / "aicluster-work"
        for job_id in submitted:
            for d in scratch.glob(f"{job_id}-a*-r*"):
                shutil.rmtree(d, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)
            shutil.rmtree(ray_temp_dir(ray_home), ignore_errors=True)
        else:
            log(f"kept {home}")


if __name__ == "__main__":
    sys.exit(main())
