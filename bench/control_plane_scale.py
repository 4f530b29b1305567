"""The live control plane at scale: the real API server (uvicorn on 127.0.0.1) and the real
job reconcile loop (control.jobs_loop.Controller, policy `fair`) over a real SQLite state
store, with a simulated engine of N nodes x 8 GPUs in this process, and a queue of jobs
from the Philly trace.

Run:   .venv/bin/python bench/control_plane_scale.py                       (1,000 nodes,
                                                                            100,000 jobs)
       .venv/bin/python bench/control_plane_scale.py --nodes 50 --jobs 2000  (< 1 min)
Options: --batch-submits N and --batch-size B (N jobs through POST /v1/jobs/batch, B per
request, timed like single submits), --python-gc (default: the collector thresholds the control-plane server sets,
control.gc_settings; `default`: CPython's, to compare), --api-submits (jobs submitted
through POST /v1/jobs and timed; the rest of the queue is preloaded straight into the
store, not timed), --concurrency (submitting clients), --ticks, --time-scale (trace seconds
per wall second of a job's run), --pages, --trace (philly.csv; synthetic Philly-like jobs
when it is absent), --json FILE.

What it reports, in one table with ratios (every figure from this run):
- submit: POST /v1/jobs throughput (jobs/s) and latency p50/p99, with the loop idle;
- GPUs after each tick: held (by gangs running, or exited and not yet seen by the loop)
  and running (at work): whether the admissions keep the cluster busy;
- tick: Controller.tick() wall time p50/p99 over --ticks ticks while jobs run, finish and
  are admitted, after the first (which reads and tells the whole preloaded queue), and
  apart from the first --cold-ticks (3) ticks, the cold start (the preloaded queue's first
  ~12,000 admissions start and their waits are read back at once); admissions/s =
  admissions / the ticks' total time;
- pending read: the tick's incremental read of the PENDING jobs (control.pending_jobs.
  PendingJobs, what changed since the last tick) against the baseline in the same run, a
  full read of every PENDING job as each tick did before (timed after each tick);
- list routes: latency p50/p99 per page of GET /v1/jobs, /v1/jobs?status=PENDING,
  /v1/events and /v1/nodes at the default page size (100) walking --pages pages by cursor,
  against the baseline of one 1,000-row page (what GET /v1/jobs answered before pages).

The engine is simulated (SimEngine below, the engine protocol of engine/protocol.py): a
launch starts at once, a worker exits 0 after its trace duration / --time-scale. Ray and the
workers are not exercised; the control plane's work is, with the server's own log store (the
state store's SharedLogStore, which the loop asks for each running rank's log end).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
from sqlalchemy import insert

from aicluster.api.app import create_app
from aicluster.control.api_ops import ApiOps
from aicluster.control.gc_settings import tune_for_control_plane
from aicluster.control.jobs_loop import Controller
from aicluster.control.logs import SharedLogStore
from aicluster.core.lifecycle import JobStatus, Reason
from aicluster.engine.protocol import LaunchRequest, NodeInfo, WorkerState
from aicluster.sim.traces import TraceJob, load_philly, synthetic
from aicluster.specs.job import JobSpec
from aicluster.store import open_store
from aicluster.store.jobfiles import JobFiles
from aicluster.store.jobs import new_job_values
from aicluster.store.quotas import QuotaStore
from aicluster.store.schema import EventRow, JobRow

GPUS_PER_NODE = 8
TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "philly.csv"


# -- the simulated engine ---------------------------------------------------------------


@dataclass
class _Gang:
    ends_at: float  # time.monotonic() when its workers exit 0
    workers: int
    gpus: int  # in all


class SimEngine:
    """N nodes x 8 GPUs; a gang starts at once and exits 0 after its job's duration
    (from the job's env AICLUSTER_BENCH_DURATION_S); thread-safe."""

    def __init__(self, n_nodes: int):
        self._nodes = [
            NodeInfo(
                node_id=f"node{i:05d}",
                name=f"host{i:05d}",
                address=f"10.{i // 250}.{i % 250}.1",
                alive=True,
                cpus=96.0,
                memory=1 << 40,
                gpus=GPUS_PER_NODE,
                gpu_model="A100",
                pool="default",
                labels={"rack": f"r{i // 32}"},
            )
            for i in range(n_nodes)
        ]
        self.gangs: dict[tuple[str, int], _Gang] = {}
        self.launches = 0
        self._lock = threading.Lock()

    def nodes(self) -> list[NodeInfo]:
        return list(self._nodes)

    def busy(self) -> tuple[float, float]:
        """(the fraction of the GPUs that gangs hold: running, or exited but not yet seen
        to by the loop; the fraction that running gangs use)."""
        now = time.monotonic()
        with self._lock:
            held = sum(g.gpus for g in self.gangs.values())
            running = sum(g.gpus for g in self.gangs.values() if g.ends_at > now)
        total = len(self._nodes) * GPUS_PER_NODE
        return held / total, running / total

    def launch(self, req: LaunchRequest) -> tuple[str, int]:
        run_s = float(req.env.get("AICLUSTER_BENCH_DURATION_S", "1"))
        with self._lock:
            self.gangs[(req.job_id, req.attempt)] = _Gang(
                time.monotonic() + run_s, len(req.placement), req.gpus * len(req.placement)
            )
            self.launches += 1
        return "10.0.0.1", 29500

    def status(self, job_id: str, attempt: int, offsets: list[int]) -> list[WorkerState]:
        with self._lock:
            gang = self.gangs.get((job_id, attempt))
        if gang is None:
            return [WorkerState(r, lost=True) for r in range(len(offsets))]
        code = 0 if time.monotonic() >= gang.ends_at else None
        return [WorkerState(r, started=True, exit_code=code) for r in range(len(offsets))]

    def stop(self, job_id: str, attempt: int, workers: int) -> None:
        with self._lock:
            self.gangs.pop((job_id, attempt), None)

    def running_gangs(self) -> set[tuple[str, int]]:
        with self._lock:
            return set(self.gangs)

    def scan_output(self, job_id: str, attempt: int, path: str) -> list[dict]:
        return []

    def upload_output(self, job_id, attempt, path, digests, storage) -> int:
        return 0


# -- the workload -------------------------------------------------------------------------


def trace_jobs(n: int, path: Path) -> tuple[list[TraceJob], str]:
    """`n` jobs of the Philly trace in submit order (repeated when it holds fewer), or
    seeded synthetic Philly-like jobs when the file is absent."""
    if path.exists():
        base = load_philly(path, start="2017-01-01", end="2018-01-01")
        jobs = [base[i % len(base)] for i in range(n)]
        return (
            jobs,
            f"Philly ({path.name}, {len(base)} jobs{', repeated' if n > len(base) else ''})",
        )
    teams = {f"t{i}": 1.0 for i in range(8)}
    return synthetic(n, teams, seed=1), "synthetic Philly-like (trace file absent)"


def team_of(j: TraceJob) -> str:
    return "vc-" + j.team


def spec_of(i: int, j: TraceJob, time_scale: float) -> JobSpec:
    workers, per = j.shape(GPUS_PER_NODE)
    run_s = max(0.05, j.duration / time_scale)
    return JobSpec.model_validate(
        {
            "name": f"p{i}",
            "team": team_of(j),
            "command": "true",
            "workers": workers,
            "resources": {"gpus": per, "cpus": 1, "memory": "1Gi"},
            "env": {"AICLUSTER_BENCH_DURATION_S": f"{run_s:.3f}"},
        }
    )


def preload(store, specs: list[JobSpec]) -> None:
    """Queue jobs straight into the store (rows and JobSubmitted events, as create_job
    writes them) in large batches: the part of the queue whose submission is not timed."""
    now = time.time()
    for start in range(0, len(specs), 5000):
        jobs, events = [], []
        for k, spec in enumerate(specs[start : start + 5000], start=start):
            job_id = f"{spec.name}-{k:06x}"
            jobs.append(new_job_values(spec, "admin", job_id, now))
            events.append(
                dict(
                    ts=now,
                    kind="job",
                    object_id=job_id,
                    team=spec.team,
                    type="JobSubmitted",
                    to_status="PENDING",
                    reason=Reason.SUBMITTED.value,
                    actor="admin",
                )
            )
        with store._session.begin() as s:
            s.execute(insert(JobRow), jobs)
            s.execute(insert(EventRow), events)


# -- measuring ------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(q / 100 * (len(s) - 1)))]


def serve(app, port: int):
    import uvicorn

    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the API server did not start")
        time.sleep(0.05)
    return server, thread


def submit_all(url: str, token: str, specs: list[dict], concurrency: int, batch: int = 0):
    """POST every spec, `concurrency` clients at once, one per request (batch 0) or
    `batch` per POST /v1/jobs/batch; (jobs/s, latencies of the requests in s). Runs in a
    process of its own (`probe`), so the clients do not share the server's GIL."""
    latencies: list[float] = []
    lock = threading.Lock()
    if batch:
        bodies = [{"specs": specs[i : i + batch]} for i in range(0, len(specs), batch)]
    else:
        bodies = [{"spec": spec} for spec in specs]
    chunks = [bodies[i::concurrency] for i in range(concurrency)]
    path = "/v1/jobs/batch" if batch else "/v1/jobs"

    def run(chunk):
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=url, headers=headers, timeout=60) as c:
            for body in chunk:
                t = time.perf_counter()
                r = c.post(path, json=body)
                took = time.perf_counter() - t
                if r.status_code != 201:
                    raise RuntimeError(f"submit answered {r.status_code}: {r.text[:300]}")
                with lock:
                    latencies.append(took)

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(run, chunks))
    return len(specs) / (time.perf_counter() - started), latencies


def page_latencies(client: httpx.Client, path: str, params: dict, pages: int) -> list[float]:
    """Walk up to `pages` pages by cursor; the latency of each."""
    out, cursor = [], None
    for _ in range(pages):
        q = dict(params, **({"cursor": cursor} if cursor else {}))
        t = time.perf_counter()
        r = client.get(path, params=q)
        out.append(time.perf_counter() - t)
        r.raise_for_status()
        cursor = r.json()["next_cursor"]
        if cursor is None:
            break
    return out


def list_probes(url: str, token: str, pages: int) -> dict[str, list[float]]:
    """Page latencies of the list routes, and the baseline (in the probe process)."""
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=headers, timeout=120) as c:
        return {
            "GET /v1/jobs (100/page)": page_latencies(c, "/v1/jobs", {}, pages),
            "GET /v1/jobs?status=PENDING": page_latencies(
                c, "/v1/jobs", {"status": "PENDING"}, pages
            ),
            "GET /v1/events (100/page)": page_latencies(c, "/v1/events", {}, pages),
            "GET /v1/nodes (100/page)": page_latencies(c, "/v1/nodes", {}, pages),
            "GET /v1/queue (100/page)": page_latencies(c, "/v1/queue", {}, pages),
            "baseline: GET /v1/jobs 1000/page": page_latencies(
                c, "/v1/jobs", {"limit": 1000}, max(3, pages // 5)
            ),
        }


def probe(fn, *args):
    """`fn(*args)` in a fresh process (spawned: no threads of this one are copied)."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args)


def run_ticks(ctrl: Controller, store, engine: SimEngine, ticks: int, deadline: float):
    """Tick `ticks` times; (tick times, incremental pending reads, full reads, admitted)."""
    refresh = ctrl.pending.refresh
    incremental: list[float] = []

    def timed_refresh():
        t = time.perf_counter()
        try:
            return refresh()
        finally:
            incremental.append(time.perf_counter() - t)

    ctrl.pending.refresh = timed_refresh  # the bench times the loop's own call
    tick_s, cpu_s, full_s, events, busy = [], [], [], [], []
    before = engine.launches
    for _ in range(ticks):
        if time.monotonic() > deadline:
            break
        written = _event_count(store)
        t, c = time.perf_counter(), time.thread_time()
        ctrl.tick()
        tick_s.append(time.perf_counter() - t)
        cpu_s.append(time.thread_time() - c)
        busy.append(engine.busy())
        events.append(_event_count(store) - written)
        t = time.perf_counter()
        store.list_jobs(statuses=[JobStatus.PENDING], limit=None)  # the old way, each tick
        full_s.append(time.perf_counter() - t)
    while any(not f.done() for f in ctrl.launching.values()):
        time.sleep(0.01)
    return tick_s, cpu_s, incremental, full_s, engine.launches - before, events, busy


def _event_count(store) -> int:
    """Events in the store (how many a tick wrote: the event table's growth at scale)."""
    from sqlalchemy import func, select

    with store._session() as s:
        return s.scalar(select(func.count()).select_from(EventRow))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--api-submits", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--batch-submits", type=int, default=5000, help="through /v1/jobs/batch")
    ap.add_argument("--batch-size", type=int, default=100, help="jobs per batch request")
    ap.add_argument("--ticks", type=int, default=20)
    ap.add_argument("--time-scale", type=float, default=3600.0)
    ap.add_argument("--pages", type=int, default=30)
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--deadline", type=float, default=900.0, help="seconds, for the ticks")
    ap.add_argument(
        "--cold-ticks",
        type=int,
        default=3,
        help="ticks reported apart as the cold start (the preloaded queue's first admissions,"
        " starts and waits)",
    )
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--python-gc",
        choices=("control-plane", "default"),
        default="control-plane",
        help="the collector thresholds the server sets (control.gc_settings) or CPython's",
    )
    args = ap.parse_args()
    if args.python_gc == "control-plane":
        tune_for_control_plane()
    if args.nodes < 1 or args.jobs < 1:
        ap.error("--nodes and --jobs must be at least 1")
    deadline = time.monotonic() + args.deadline

    home = Path(tempfile.mkdtemp(prefix="aic-cpscale-"))
    store = open_store(home / "state.db")
    store.create_user("admin", None, "admin")
    token = store.create_token("admin")
    trace, source = trace_jobs(args.jobs, args.trace)
    for team in sorted({team_of(j) for j in trace}):
        store.ensure_team(team)
    specs = [spec_of(i, j, args.time_scale) for i, j in enumerate(trace)]
    n_api = min(args.api_submits, len(specs))
    n_batch = min(args.batch_submits, len(specs) - n_api)
    t = time.perf_counter()
    preload(store, specs[n_api + n_batch :])
    preload_s = time.perf_counter() - t

    engine = SimEngine(args.nodes)
    logs = SharedLogStore(JobFiles(store), home / "logs")  # the server's: in the state store
    ctrl = Controller(
        store, engine, logs, home / "workdirs", home, policy="fair", quotas=QuotaStore(store)
    )
    ops = ApiOps(
        store,
        engine,
        logs,
        home / "workdirs",
        queue=lambda: ctrl.queue,
        allocated=ctrl.fresh_allocations,
    )
    port = _free_port()
    server, thread = serve(create_app(ops), port)
    url = f"http://127.0.0.1:{port}"
    try:
        docs = [s.model_dump(mode="json") for s in specs[:n_api]]
        rate, submit_lat = probe(submit_all, url, token, docs, args.concurrency)
        docs = [s.model_dump(mode="json") for s in specs[n_api : n_api + n_batch]]
        batched = (
            probe(submit_all, url, token, docs, args.concurrency, args.batch_size)
            if docs
            else (0.0, [])
        )
        ticks = run_ticks(ctrl, store, engine, args.ticks, deadline)
        lists = probe(list_probes, url, token, args.pages)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        ctrl.close()
    report(args, source, preload_s, (rate, submit_lat), batched, ticks, lists)


def report(args, source, preload_s, single, batched, ticks, lists):
    (rate, submit_lat), (batch_rate, batch_lat) = single, batched
    tick_s, cpu_s, incr_s, full_s, admitted, events, busy_gpus = ticks
    later, cpu = (tick_s[1:], cpu_s[1:]) if len(tick_s) > 1 else (tick_s, cpu_s)
    steady = tick_s[args.cold_ticks :] or later
    incr_s = incr_s[1:] if len(incr_s) > 1 else incr_s  # the first refresh reads them all
    ms = 1000.0
    busy = sum(tick_s)
    rows = [
        ("submit (POST /v1/jobs)", f"{rate:.0f} jobs/s", pct(submit_lat, 50), pct(submit_lat, 99)),
        (
            f"submit batch ({args.batch_size}/request)",
            f"{batch_rate:.0f} jobs/s",
            pct(batch_lat, 50) if batch_lat else None,
            pct(batch_lat, 99) if batch_lat else None,
        ),
        ("first tick (the whole queue new)", "1 tick", tick_s[0], tick_s[0]),
        ("tick (Controller.tick), after", f"{len(later)} ticks", pct(later, 50), pct(later, 99)),
        (
            "tick, steady (after the cold start)",
            f"{len(steady)} ticks",
            pct(steady, 50),
            pct(steady, 99),
        ),
        ("tick CPU, the loop's thread, after", "thread time", pct(cpu, 50), pct(cpu, 99)),
        ("admissions", f"{admitted / busy if busy else 0:.0f} /s", None, None),
        ("pending read, incremental", "in the tick", pct(incr_s, 50), pct(incr_s, 99)),
        ("baseline: full pending read", "after each tick", pct(full_s, 50), pct(full_s, 99)),
    ]
    rows += [(name, f"{len(v)} pages", pct(v, 50), pct(v, 99)) for name, v in lists.items()]
    print(
        f"\ncontrol plane at scale: {args.nodes} nodes x {GPUS_PER_NODE} GPUs, "
        f"{args.jobs} queued jobs from {source}"
    )
    print(
        f"({min(args.api_submits, args.jobs)} submitted one per request and "
        f"{max(0, min(args.batch_submits, args.jobs - args.api_submits))} in batches "
        f"through the API, the rest preloaded in {preload_s:.1f} s; {admitted} admitted "
        f"in {busy:.1f} s of ticks)\n"
    )
    print(f"{'what':36s} {'count/rate':>16s} {'p50 ms':>10s} {'p99 ms':>10s}")
    for name, what, p50, p99 in rows:
        f50 = f"{p50 * ms:10.1f}" if p50 is not None else f"{'-':>10s}"
        f99 = f"{p99 * ms:10.1f}" if p99 is not None else f"{'-':>10s}"
        print(f"{name:36s} {what:>16s} {f50} {f99}")
    jobs_page = lists["GET /v1/jobs (100/page)"]
    base = lists["baseline: GET /v1/jobs 1000/page"]
    print("\nratios:")
    print(f"  pending read, full / incremental (p50): {pct(full_s, 50) / pct(incr_s, 50):.1f}x")
    print(f"  1000-row page / 100-row page (p50):     {pct(base, 50) / pct(jobs_page, 50):.1f}x")
    queue_page = lists["GET /v1/queue (100/page)"]
    print(  # what GET /v1/queue read on every call before it was paged: every pending job
        f"  full pending read / /v1/queue page (p50): {pct(full_s, 50) / pct(queue_page, 50):.0f}x"
    )
    if len(events) > 1:
        after = events[1:]
        print(
            f"  events written per tick, after the first: p50 {pct(after, 50):.0f}, "
            f"max {max(after)} (first tick {events[0]}; {admitted} admissions in all)"
        )
    after = busy_gpus[1:] or busy_gpus
    held, running = [h for h, _ in after], [r for _, r in after]
    print(
        f"  GPUs after each tick (after the first): held p50 {100 * pct(held, 50):.1f}%; "
        f"running p50 {100 * pct(running, 50):.1f}%, min {100 * min(running):.1f}% (held: "
        "by gangs running or exited unseen; running: at work)"
    )
    print(f"  tick p99 (after the first) / goal 250 ms: {pct(later, 99) * ms / 250:.2f}")
    print(
        f"  tick p99, steady (after the first {args.cold_ticks}) / goal 250 ms: "
        f"{pct(steady, 99) * ms / 250:.2f}"
    )
    print(f"  submit rate / goal 1000 jobs/s:         {rate / 1000:.2f}")
    if batch_rate:
        print(f"  batch submit rate / goal 1000 jobs/s:   {batch_rate / 1000:.2f}")
        print(f"  batch / one-per-request submit rate:    {batch_rate / rate:.1f}x")
    worst = max(pct(v, 99) for k, v in lists.items() if not k.startswith("baseline"))
    print(f"  list page p99 (worst) / goal 100 ms:    {worst * ms / 100:.2f}")
    if args.json:
        out = {
            "nodes": args.nodes,
            "jobs": args.jobs,
            "source": source,
            "submit_jobs_per_s": rate,
            "submit_s": submit_lat,
            "tick_s": tick_s,
            "tick_cpu_s": cpu_s,
            "pending_incremental_s": incr_s,
            "pending_full_s": full_s,
            "admitted": admitted,
            "lists_s": lists,
        }
        args.json.write_text(json.dumps(out))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    random.seed(0)
    sys.exit(main())
