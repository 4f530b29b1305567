"""Node chaos benchmark: worker machines SIGKILLed and rejoined under a mixed job load,
as an operator would do it with the CLI.

Run:   .venv/bin/python bench/node_chaos.py             (default: 30 jobs, 6 kills; ~6-7 min on
                                                      a 2-core machine)
       .venv/bin/python bench/node_chaos.py --jobs 6 --gangs 2 --cycles 2 --kill-every 12 \\
           --rejoin-after 6 --steps 300 --interval 0.1 --worker-cpus 3 --checkpoint-every 30
                                                     (small, what the e2e test runs: ~2-3 min)
Options: --jobs (all jobs, gangs included), --gangs (2-worker checkpointing jobs among them),
         --cycles (kills), --kill-every SECONDS (from one kill to the next; the first comes that
         long after the jobs are submitted), --rejoin-after SECONDS (kill -> the same machine
         joins again), --workers, --worker-cpus, --steps, --interval, --checkpoint-every,
         --max-restarts, --api-port, --json FILE (the figures as JSON), --deadline SECONDS (hard
         bound, default 1500), --keep (keep the temp folder: homes, logs, shared files).
Tests: tests/e2e/test_node_chaos.py imports `run_chaos(ChaosConfig(...)) -> Results`.

Setup, all on loopback, every machine its own installation (its own temp AICLUSTER_HOME):
the head is `aicluster up --head --num-cpus 0 --shared-path SHARED --label machine=head`
(no CPUs, so every job runs on a worker machine; `up` configures Ray's health checks so a
killed node is declared dead in ~1.5 s when its connections are refused, as here on one box,
and in ~4.5 s when its packets are dropped; see engine.raynode.NODE_DEATH_DETECTION); each worker machine is
`aicluster join RAY_ADDRESS --ray-token-file HEAD/ray/auth_token --num-cpus N
--label machine=wK`. The `machine` label is how a node row is matched to its machine.

Load: --jobs jobs submitted at once with the SDK, each a working_dir script run with the
workload's `python3` (sandboxed as the team's user where the node can): --gangs of them are
2-worker gangs that checkpoint (`aicluster.runtime.checkpoint.save`, rank 0, every
--checkpoint-every steps) and resume from `checkpoint.latest()` (printing `resumed from step
S`); the others are single workers that start over from step 1. All have max_restarts
--max-restarts. Every worker prints `step N t=<unix time> attempt=<AICLUSTER_ATTEMPT>` every
--interval s for --steps steps, and appends each line, after printing it, to
SHARED/<job id>.r<rank>.log: that file is the ground truth of what ran and when.

Chaos: every --kill-every s one worker machine (round robin) dies: every process of its
installation (`engine.raynode.installation_processes`: its Ray temp dir or token path in
their environment, and every descendant, the sandboxed job processes) is SIGKILLed at
once. --rejoin-after s later the same machine (same home) runs
`aicluster join` again. --cycles times. Then the run waits for every job to end (bounded by
--deadline), reads every attempt's log through the API, and `aicluster down`s everything.

Printed per kill (min/median/max over the jobs that had a worker on the killed node):
  before    the killed node's state and CPUs allocated/offered just before the kill
  down      kill -> the killed node seen not alive in GET /v1/nodes (polled every 0.5 s)
  requeued  kill -> the job's event leaving RUNNING (PENDING: requeued, or FAILED)
  running   kill -> the job's next RUNNING event
  caught up kill -> the first line of the new attempt whose step >= the last step the killed
            attempt printed before the kill (shared file times; a single worker starts over,
            so this includes redoing its work; a gang resumes from its checkpoint)
At the end:
  jobs succeeded / failed (reason and message) / stuck (not terminal at the end)
  run twice: jobs with two attempts running at once (their [first line, last line] intervals
            in the shared files overlap)
  lines lost: lines in the shared files missing from the logs of all the job's attempts as the
            API serves them (`aicluster logs`), printed 25 ms or more before a kill; the lines
            printed less than 25 ms before their machine was SIGKILLed, or while it was being
            killed (after its first process died: the SIGKILLs of one machine are sent one
            by one), are "in flight" (still in its pipe or network stack) and counted apart,
            as no platform can save them; every lost line is printed with its age
  nodes: rows of GET /v1/nodes against the machines alive (live installations)
  baselines measured in the same run: recovery time (kill -> RUNNING again) over the node's
            death detection time (kill -> down), the floor it cannot beat; and job wall time
            (first start -> end) over its no-kill ideal (steps x interval), for jobs hit by a
            kill against jobs that were not (the latter are the in-run baseline).
Goals (issue 20), PASS/FAIL (N/A: nothing to judge; exit status 1 on any FAIL): 0 stuck; 0 run twice; 0 lines lost; the node list is the live
machines (one row each, alive) plus Down rows only for machines that are dead now; a
single-worker job hit by a kill is RUNNING again <= 5 s after the kill when capacity existed
(at the first /v1/nodes+/v1/jobs sample after its requeue the live nodes' free CPUs covered
every PENDING job; jobs without capacity are counted apart).

Figures are wall-clock on whatever else the machine is running: the load average is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import psutil

from aicluster.engine.rayenv import ray_temp_dir
from aicluster.engine.raynode import installation_processes

AICLUSTER = [sys.executable, "-m", "aicluster.cli.main"]
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
LINE_RE = re.compile(r"^step (\d+) t=([0-9.]+) attempt=(\S+)$")
ATTEMPT_RE = re.compile(r"attempt=(\S+)$")
RECOVERY_GOAL_S = 5.0
POLL_S = 0.5
ANALYSIS_MARGIN_S = 90.0  # kept from --deadline for reading logs, printing and cleaning up

JOB_SCRIPT = r'''"""One chaos-bench worker: numbered, timestamped steps, copied to the shared folder."""
import argparse, os, tempfile, time

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, required=True)
p.add_argument("--interval", type=float, required=True)
p.add_argument("--shared", required=True)
p.add_argument("--checkpoint-every", type=int, default=0)
a = p.parse_args()
job = os.environ.get("AICLUSTER_JOB_ID", "local")
rank = os.environ.get("RANK", "0")
attempt = os.environ.get("AICLUSTER_ATTEMPT") or str(os.getpid())
out = open(os.path.join(a.shared, f"{job}.r{rank}.log"), "a")


def say(line):
    print(line, flush=True)
    out.write(line + "\n")
    out.flush()


start = 0
if a.checkpoint_every:
    from aicluster.runtime import checkpoint

    found = checkpoint.latest()
    if found is not None:
        start = int((found / "step.txt").read_text())
        say(f"resumed from step {start} attempt={attempt}")
for step in range(start + 1, a.steps + 1):
    say(f"step {step} t={time.time():.3f} attempt={attempt}")
    if a.checkpoint_every and rank == "0" and step % a.checkpoint_every == 0 and step < a.steps:
        d = tempfile.mkdtemp()
        with open(os.path.join(d, "step.txt"), "w") as f:
            f.write(str(step))
        checkpoint.save(d, step=step)
    time.sleep(a.interval)
say(f"done rank {rank} attempt={attempt}")
'''


class BenchError(RuntimeError):
    pass


class DeadlineReached(BaseException):  # not an Exception: no `except Exception` swallows it
    pass


_cleaning = threading.Event()  # set while cleaning up: the hard deadline waits for it


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- data


# A line printed this shortly before its machine was SIGKILLed may not have left it yet.
IN_FLIGHT_S = 0.025


@dataclass
class ChaosConfig:
    jobs: int = 30
    gangs: int = 10
    cycles: int = 6
    kill_every: float = 35.0
    rejoin_after: float = 15.0
    workers: int = 3
    worker_cpus: int = 6
    steps: int = 500
    interval: float = 0.15
    checkpoint_every: int = 50
    max_restarts: int = 3
    api_port: int = 0
    deadline: float = 1500.0
    keep: bool = False
    json_path: str | None = None
    root: str | None = None  # the temp folder (default: a new one under the system's temp)
    # a line printed less than this before its machine's kill is in flight, not lost
    in_flight_s: float = IN_FLIGHT_S


@dataclass
class Affected:
    job: str
    workers: int
    attempt: int  # the attempt that was killed
    pre_step: int | None  # last step it printed before the kill
    requeued_s: float | None = None
    running_s: float | None = None
    caught_up_s: float | None = None
    ended: str | None = None  # PENDING (requeued) or FAILED
    capacity: bool | None = None


@dataclass
class Kill:
    cycle: int
    machine: str
    node_id: str | None
    t_kill: float
    killed: int  # processes
    before: str | None = None  # the node's state and CPUs used/offered at the last sample
    down_s: float | None = None
    rejoined_s: float | None = None  # kill -> the machine's node alive again
    affected: list[Affected] = field(default_factory=list)


@dataclass
class Results:
    config: dict
    kills: list[Kill]
    jobs: dict[str, dict]  # id -> {status, reason, message, workers, attempts, wall_s}
    succeeded: list[str]
    failed: dict[str, str]
    stuck: list[str]
    run_twice: list[str]
    join_retries: int  # rejoins tried twice (the first failed on a loaded machine)
    lines_lost: dict[str, int]  # job id -> lines missing from its logs (only jobs with some)
    lines_total: int
    # job id -> lines missing that were printed less than in_flight_s before their
    # machine's kill, or while it died: still in its pipe or network stack, a loss no
    # platform can prevent
    lines_in_flight: dict[str, int]
    lost_lines: list  # (job, line, seconds before its machine's kill or None) of lines lost
    in_flight_lines: list  # the same, of the lines in flight
    node_rows: list[dict]  # {machine, node_id, alive, state}
    machines_alive: list[str]
    nodes_ok: bool
    goals: dict[str, dict]  # name -> {ok, text}
    baselines: dict[str, float | None]
    wall_s: float
    load: tuple[float, float, float]

    def to_json(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------- machines


def cli_env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "AICLUSTER_"))}
    env["AICLUSTER_HOME"] = str(home)
    return env


def cli(home: Path, *args: str, check: bool = True, timeout: float = 240):
    proc = subprocess.run(
        AICLUSTER + list(args),
        env=cli_env(home),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise BenchError(
            f"aicluster {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def kill_machine(home: Path) -> tuple[int, float]:
    """A machine dying: SIGKILL every process of its installation at once (twice more for
    anything that forked meanwhile). Returns how many processes were killed and when the
    first SIGKILL was sent."""
    killed: set[int] = set()
    first = None
    for _ in range(3):
        procs = installation_processes(home)
        if not procs:
            break
        first = first or time.time()
        for p in procs:
            try:
                p.kill()
                killed.add(p.pid)
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=2)
    return len(killed), first or time.time()


@dataclass
class Machine:
    name: str
    home: Path
    alive: bool = False


# --------------------------------------------------------------------------- the run


class Poller(threading.Thread):
    """Samples GET /v1/nodes and GET /v1/jobs every POLL_S seconds."""

    def __init__(self, url: str, token: str):
        super().__init__(daemon=True)
        from aicluster.client.api import Client

        self.client = Client(url, token, timeout=10)
        self.samples: list[tuple[float, list[dict], dict[str, str]]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        from aicluster.client.api import ApiError

        while not self.stop.is_set():
            try:
                nodes = self.client.nodes()
                jobs = {j["id"]: j["status"] for j in self.client.jobs()}
                self.samples.append((time.time(), nodes, jobs))
            except ApiError:
                pass
            self.stop.wait(POLL_S)
        self.client.close()


def node_machine(node: dict) -> str | None:
    return (node.get("labels") or {}).get("machine")


def job_spec(name: str, workers: int, cfg: ChaosConfig, shared: Path) -> dict:
    cmd = f"python3 chaos_job.py --steps {cfg.steps} --interval {cfg.interval} --shared {shared}"
    if workers > 1:
        cmd += f" --checkpoint-every {cfg.checkpoint_every}"
    return {
        "kind": "job",
        "name": name,
        "team": "default",
        "workers": workers,
        "resources": {"cpus": 1},
        "command": cmd,
        "working_dir": ".",
        "max_restarts": cfg.max_restarts,
    }


class Chaos:
    def __init__(self, cfg: ChaosConfig):
        self.cfg = cfg
        self.t_start = time.time()
        self.hard_end = time.monotonic() + cfg.deadline
        self.root = Path(cfg.root or tempfile.mkdtemp(prefix="aic-chaos-"))
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o711)
        self.shared = self.root / "shared"
        self.shared.mkdir(exist_ok=True)
        os.chmod(self.shared, 0o777)  # the jobs run as the team's own user
        self.head = Machine("head", self.root / "head")
        self.machines = [Machine(f"w{i + 1}", self.root / f"w{i + 1}") for i in range(cfg.workers)]
        self.admin = None
        self.poller: Poller | None = None
        self.ray_address = ""
        self.url = ""
        self.job_ids: list[str] = []
        self.kills: list[Kill] = []
        self.join_retries = 0  # joins that failed once and were tried again

    # -- time

    def left(self) -> float:
        return self.hard_end - time.monotonic()

    def sleep_until(self, t: float) -> None:
        while (d := t - time.time()) > 0:
            if self.left() < ANALYSIS_MARGIN_S:
                raise DeadlineReached()
            time.sleep(min(d, 0.5))

    # -- machines

    def up(self) -> None:
        port = self.cfg.api_port or _free_port()
        log(f"head: aicluster up --head (home {self.head.home})")
        out = cli(
            self.head.home,
            "up",
            "--head",
            "--api-port",
            str(port),
            "--num-cpus",
            "0",
            "--label",
            "machine=head",
            "--shared-path",
            str(self.shared),
        ).stdout
        self.head.alive = True
        m = re.search(r"Ray head:\s+(\S+)", out)
        if not m:
            raise BenchError(f"no Ray address in the output of `aicluster up`:\n{out}")
        self.ray_address = m.group(1)
        self.url = json.loads((self.head.home / "client.json").read_text())["url"]
        token = (self.head.home / "admin.token").read_text().strip()
        from aicluster.client.api import Client

        self.admin = Client(self.url, token, timeout=30)
        for m in self.machines:
            self.join(m)
        self.poller = Poller(self.url, token)
        self.poller.start()

    def join(self, m: Machine) -> float:
        """`aicluster join` from the machine's home; returns when its node is alive. A join
        that fails (on a loaded machine Ray's raylet may not register within its start-up
        timeout) is tried once more after its leftovers are killed, as an operator would."""
        for attempt in (1, 2):
            log(f"{m.name}: aicluster join" + (" (again)" if attempt > 1 else ""))
            try:
                cli(
                    m.home,
                    "join",
                    self.ray_address,
                    "--ray-token-file",
                    str(self.head.home / "ray" / "auth_token"),
                    "--num-cpus",
                    str(self.cfg.worker_cpus),
                    "--label",
                    f"machine={m.name}",
                )
                break
            except BenchError as exc:
                if attempt > 1:
                    raise
                log(f"{m.name}: join failed ({str(exc).splitlines()[-1][:120]}); killing leftovers")
                self.join_retries += 1
                kill_machine(m.home)
        m.alive = True
        while True:
            if any(node_machine(n) == m.name and n["alive"] for n in self.admin.nodes()):
                return time.time()
            if self.left() < ANALYSIS_MARGIN_S:
                raise DeadlineReached()
            time.sleep(0.2)

    def down_all(self) -> None:
        for m in [*self.machines, self.head]:
            if not m.home.exists():
                continue
            try:
                cli(m.home, "down", check=False, timeout=120)
            except subprocess.TimeoutExpired:
                log(f"{m.name}: aicluster down timed out")
            left, _ = kill_machine(m.home)  # anything `down` missed
            if left:
                log(f"{m.name}: {left} process(es) left after `aicluster down`, killed")
            m.alive = False

    # -- load

    def submit(self) -> None:
        from aicluster.client.api import pack_workdir

        wd = self.root / "workdir"
        wd.mkdir(exist_ok=True)
        (wd / "chaos_job.py").write_text(JOB_SCRIPT)
        tar = pack_workdir(wd)
        cfg = self.cfg
        # gangs spread evenly through the submission order: a queue of all gangs first
        # keeps the single workers waiting behind them (and out of the kills' reach)
        gang_at = {k * cfg.jobs // cfg.gangs for k in range(cfg.gangs)} if cfg.gangs else set()
        n_gangs = n_singles = 0
        for i in range(cfg.jobs):
            if i in gang_at:
                name, workers, n_gangs = f"chaos-g{n_gangs}", 2, n_gangs + 1
            else:
                name, workers, n_singles = f"chaos-s{n_singles}", 1, n_singles + 1
            spec = job_spec(name, workers, cfg, self.shared)
            self.job_ids.append(self.admin.submit(spec, tar)["id"])
        log(f"submitted {cfg.jobs} jobs ({cfg.gangs} 2-worker gangs)")

    # -- chaos

    def node_of(self, m: Machine) -> str | None:
        for n in self.admin.nodes():
            if node_machine(n) == m.name and n["alive"]:
                return n["node_id"]
        return None

    def chaos(self) -> None:
        t0 = time.time()
        for cycle in range(self.cfg.cycles):
            m = self.machines[cycle % len(self.machines)]
            self.sleep_until(t0 + (cycle + 1) * self.cfg.kill_every)
            node = self.node_of(m)
            n, t_kill = kill_machine(m.home)
            m.alive = False
            log(f"kill {cycle + 1}/{self.cfg.cycles}: {m.name} (node {str(node)[:8]}, {n} procs)")
            k = Kill(cycle + 1, m.name, node, t_kill, n)
            self.kills.append(k)
            self.sleep_until(t_kill + self.cfg.rejoin_after)
            k.rejoined_s = self.join(m) - t_kill

    def wait_jobs(self) -> None:
        log("waiting for every job to end")
        while self.left() > ANALYSIS_MARGIN_S:
            jobs = self.admin.jobs()
            if all(j["status"] in TERMINAL for j in jobs if j["id"] in self.job_ids):
                return
            time.sleep(1.0)
        log("deadline: analysing with jobs still running")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- analysis


def last_lines(client, job_id: str, job: dict, n: int = 4) -> str:
    """The last `n` lines of each rank's log in the job's last attempt, indented (empty
    when there are none), for the report of a failed job."""
    attempt = job.get("attempt") or 0
    out = []
    for rank in range(job["spec"]["workers"]):
        tail = read_log(client, job_id, rank, attempt).splitlines()[-n:] if attempt else []
        out += [f"\n      rank {rank} attempt {attempt}: {line[:200]}" for line in tail]
    return "".join(out)


def read_log(client, job_id: str, rank: int, attempt: int) -> str:
    from aicluster.client.api import ApiError

    chunks, offset = [], 0
    while True:
        try:
            data, nxt, _, got = client.logs(job_id, rank, attempt, offset)
        except ApiError:
            break
        if not data or got != attempt:
            break
        chunks.append(data)
        offset = nxt
    return b"".join(chunks).decode("utf-8", "replace")


def shared_lines(shared: Path, job_id: str, rank: int) -> list[str]:
    path = shared / f"{job_id}.r{rank}.log"
    try:
        return [x for x in path.read_text(errors="replace").splitlines() if x]
    except OSError:
        return []


def age_at_kill(line: str, job: str, killed: dict[tuple[str, int], float]) -> float | None:
    """How long before its machine's SIGKILL the (step) line was printed (negative: while
    the machine was being killed, after its first process died); None when the attempt
    that printed it was never hit by a kill. `killed`: (job, attempt) -> kill time."""
    m = LINE_RE.match(line)
    if not m or (job, attempt_no(m[3])) not in killed:
        return None
    return killed[(job, attempt_no(m[3]))] - float(m[2])


def steps_of(lines: list[str]) -> list[tuple[int, float, str]]:
    """(step, t, attempt) of every step line."""
    return [(int(m[1]), float(m[2]), m[3]) for x in lines if (m := LINE_RE.match(x))]


def attempt_no(a: str) -> int:
    try:
        return int(a)
    except ValueError:
        return -1


def overlapping(intervals: list[tuple[float, float]]) -> bool:
    s = sorted(intervals)
    return any(b[0] < a[1] for a, b in zip(s, s[1:]))


def first_event(events: list[dict], after: float, statuses: set[str]) -> dict | None:
    for e in sorted(events, key=lambda e: e["ts"]):
        if e["ts"] > after and e.get("to_status") in statuses:
            return e
    return None


def capacity_at(samples, t: float, job_id: str, demand: dict[str, float]) -> bool | None:
    """At the first sample at or after `t`: was the job already placed, or did the live
    nodes' free CPUs cover every PENDING job?"""
    for ts, nodes, jobs in samples:
        if ts < t:
            continue
        status = jobs.get(job_id)
        if status is None:
            return None
        if status != "PENDING":
            return True
        free = sum(
            n["cpus"] - (n.get("allocated") or {}).get("cpus", 0)
            for n in nodes
            if n["alive"] and n.get("state") in ("Ready", None)
        )
        need = sum(demand.get(j, 1.0) for j, s in jobs.items() if s == "PENDING")
        return free >= need
    return None


def analyse(ch: Chaos) -> Results:
    cfg, admin = ch.cfg, ch.admin
    samples = ch.poller.samples if ch.poller else []
    jobs = {jid: admin.job(jid) for jid in ch.job_ids}
    demand = {jid: j["spec"]["workers"] * j["spec"]["resources"]["cpus"] for jid, j in jobs.items()}
    lines = {
        jid: {r: shared_lines(ch.shared, jid, r) for r in range(j["spec"]["workers"])}
        for jid, j in jobs.items()
    }

    # per kill
    for k in ch.kills:
        if k.node_id:
            for ts, nodes, _ in samples:
                if ts < k.t_kill:
                    row = next((n for n in nodes if n["node_id"] == k.node_id), None)
                    if row:
                        used = (row.get("allocated") or {}).get("cpus", 0)
                        k.before = f"{row.get('state')} {used:g}/{row['cpus']:g}"
                    continue
                row = next((n for n in nodes if n["node_id"] == k.node_id), None)
                if row is None or not row["alive"] or row.get("state") == "Down":
                    k.down_s = ts - k.t_kill
                    break
        for jid, j in jobs.items():
            for a in j.get("attempts") or []:
                started = a.get("admitted_at") or 0
                ended = a.get("ended_at")
                if k.node_id not in (a.get("placement") or []) or started > k.t_kill:
                    continue
                if ended is not None and ended < k.t_kill:
                    continue
                att = a["attempt"]
                before = [
                    s
                    for r in lines[jid].values()
                    for s, t, at in steps_of(r)
                    if attempt_no(at) == att and t <= k.t_kill
                ]
                aff = Affected(jid, j["spec"]["workers"], att, max(before) if before else None)
                left = first_event(j["events"], k.t_kill, {"PENDING", "FAILED", "SUCCEEDED"})
                if left:
                    aff.requeued_s = left["ts"] - k.t_kill
                    aff.ended = left["to_status"]
                    back = first_event(j["events"], left["ts"], {"RUNNING"})
                    if left["to_status"] == "PENDING" and back:
                        aff.running_s = back["ts"] - k.t_kill
                    if left["to_status"] == "PENDING":
                        aff.capacity = capacity_at(samples, left["ts"], jid, demand)
                if aff.pre_step is not None:
                    later = sorted(
                        t
                        for r in lines[jid].values()
                        for s, t, at in steps_of(r)
                        if attempt_no(at) > att and s >= aff.pre_step
                    )
                    if later:
                        aff.caught_up_s = later[0] - k.t_kill
                k.affected.append(aff)

    # per job
    summary, succeeded, failed, stuck, twice, lost, flying = {}, [], {}, [], [], {}, {}
    lines_total = 0
    killed = {(a.job, a.attempt): k.t_kill for k in ch.kills for a in k.affected}
    lost_lines: list[tuple[str, str, float | None]] = []  # (job, line, age at the kill)
    flying_lines: list[tuple[str, str, float | None]] = []
    for jid, j in jobs.items():
        status = j["status"]
        if status == "SUCCEEDED":
            succeeded.append(jid)
        elif status in TERMINAL:
            failed[jid] = f"{status} {j['reason']}: {j.get('message') or ''}".strip()
            failed[jid] += last_lines(admin, jid, j)  # why it failed, in its own words
        else:
            stuck.append(jid)
        intervals: dict[str, list[float]] = {}
        missing = late = 0
        for r, rl in lines[jid].items():
            for _, t, at in steps_of(rl):
                iv = intervals.setdefault(at, [t, t])
                iv[0], iv[1] = min(iv[0], t), max(iv[1], t)
            served = set()
            for a in range(1, (j.get("attempt") or 0) + 1):
                served.update(read_log(admin, jid, r, a).splitlines())
            lines_total += len(rl)
            for x in rl:
                if x in served:
                    continue
                age = age_at_kill(x, jid, killed)
                missing += 1
                if age is not None and age < cfg.in_flight_s:
                    late += 1
                    flying_lines.append((jid, x, age))
                else:
                    lost_lines.append((jid, x, age))
        if late:
            flying[jid] = late
            missing -= late
        if overlapping([tuple(v) for v in intervals.values()]):
            twice.append(jid)
        if missing:
            lost[jid] = missing
        attempts = j.get("attempts") or []
        first = next((a["started_at"] for a in attempts if a.get("started_at")), None)
        wall = (j["finished_at"] - first) if first and j.get("finished_at") else None
        summary[jid] = {
            "status": status,
            "reason": j.get("reason"),
            "message": j.get("message"),
            "workers": j["spec"]["workers"],
            "attempts": j.get("attempt"),
            "wall_s": wall,
        }

    # nodes
    rows = [
        {
            "machine": node_machine(n),
            "node_id": n["node_id"],
            "alive": n["alive"],
            "state": n.get("state"),
        }
        for n in admin.nodes()
    ]
    machines = [ch.head, *ch.machines]
    alive = [m.name for m in machines if m.alive and installation_processes(m.home)]
    nodes_ok = True
    for m in machines:
        mine = [r for r in rows if r["machine"] == m.name]
        if m.name in alive:
            nodes_ok &= len(mine) == 1 and mine[0]["alive"]
        else:
            nodes_ok &= all(not r["alive"] for r in mine) and len(mine) <= 1
    nodes_ok &= all(r["machine"] in {m.name for m in machines} for r in rows)

    # baselines measured in this run
    hit = {a.job for k in ch.kills for a in k.affected}
    ideal = cfg.steps * cfg.interval
    ratio = lambda ids: _median([summary[i]["wall_s"] / ideal for i in ids if summary[i]["wall_s"]])
    unhit_r = ratio([i for i in succeeded if i not in hit])
    hit_r = ratio([i for i in succeeded if i in hit])
    rec_over_det = _median(
        [a.running_s / k.down_s for k in ch.kills for a in k.affected if a.running_s and k.down_s]
    )
    singles = [a for k in ch.kills for a in k.affected if a.workers == 1 and a.ended == "PENDING"]
    with_cap = [a for a in singles if a.capacity]
    slow = [a for a in with_cap if a.running_s is None or a.running_s > RECOVERY_GOAL_S]
    baselines = {
        "detect_median_s": _median([k.down_s for k in ch.kills if k.down_s is not None]),
        "recovery_over_detection_median": rec_over_det,
        "wall_over_ideal_unhit_median": unhit_r,
        "wall_over_ideal_hit_median": hit_r,
        "hit_over_unhit": (hit_r / unhit_r) if hit_r and unhit_r else None,
        "ideal_job_s": ideal,
    }
    n_dead = len([r for r in rows if not r["alive"]])
    goals = {
        "0 stuck": {"ok": not stuck, "text": f"{len(stuck)} stuck"},
        "0 run twice": {"ok": not twice, "text": f"{len(twice)} run twice"},
        "0 lines lost": {
            "ok": not lost,
            "text": f"{sum(lost.values())} of {lines_total} lines lost in {len(lost)} job(s); "
            f"{sum(flying.values())} in flight (printed < {cfg.in_flight_s * 1000:g} ms before "
            "its machine's kill, or while it died)",
        },
        "node list = live machines + dead now": {
            "ok": nodes_ok,
            "text": f"{len(rows)} rows ({n_dead} not alive) for {len(alive)} live machines",
        },
        f"single-worker RUNNING again <= {RECOVERY_GOAL_S:g} s (capacity)": {
            "ok": (not slow) if with_cap else None,  # None: no case to judge
            "text": f"{len(with_cap) - len(slow)} of {len(with_cap)} with capacity; "
            f"{len(singles) - len(with_cap)} requeued without capacity not judged",
        },
    }
    return Results(
        config=asdict(cfg),
        kills=ch.kills,
        jobs=summary,
        succeeded=succeeded,
        failed=failed,
        stuck=stuck,
        run_twice=twice,
        join_retries=ch.join_retries,
        lines_lost=lost,
        lines_total=lines_total,
        lines_in_flight=flying,
        lost_lines=lost_lines,
        in_flight_lines=flying_lines,
        node_rows=rows,
        machines_alive=alive,
        nodes_ok=nodes_ok,
        goals=goals,
        baselines=baselines,
        wall_s=time.time() - ch.t_start,
        load=os.getloadavg(),
    )


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


# --------------------------------------------------------------------------- printing


def fmt(v, spec: str = ".1f") -> str:
    return "-" if v is None else f"{v:{spec}}"


def mmm(values: list[float | None]) -> str:
    v = sorted(x for x in values if x is not None)
    if not v:
        return "-"
    return f"{v[0]:.1f}/{statistics.median(v):.1f}/{v[-1]:.1f}"


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


def report(res: Results) -> None:
    c = res.config
    print(
        f"\nnode chaos: {c['jobs']} jobs ({c['gangs']} 2-worker gangs, max_restarts "
        f"{c['max_restarts']}, {c['steps']} steps x {c['interval']} s), {len(res.kills)} kills "
        f"of {c['workers']} worker machines x {c['worker_cpus']} CPUs, every "
        f"{c['kill_every']:g} s, rejoin after {c['rejoin_after']:g} s; run {res.wall_s:.0f} s, "
        f"load {res.load[0]:.1f}/{res.load[1]:.1f}/{res.load[2]:.1f}"
    )
    rows = []
    for k in res.kills:
        a = k.affected
        rows.append(
            [
                f"{k.cycle} {k.machine}",
                k.before or "-",
                k.killed,
                fmt(k.down_s),
                fmt(k.rejoined_s),
                f"{sum(x.workers == 1 for x in a)}+{sum(x.workers > 1 for x in a)}g",
                mmm([x.requeued_s for x in a]),
                mmm([x.running_s for x in a]),
                mmm([x.caught_up_s for x in a]),
                sum(x.ended == "FAILED" for x in a),
            ]
        )
    table(
        "per kill (seconds from the SIGKILL; min/median/max over the jobs hit)",
        [
            "kill",
            "before",
            "procs",
            "down",
            "rejoined",
            "jobs hit",
            "requeued",
            "running",
            "caught up",
            "failed",
        ],
        rows,
    )
    singles = [a for k in res.kills for a in k.affected if a.workers == 1]
    gangs = [a for k in res.kills for a in k.affected if a.workers > 1]
    table(
        "all kills together (min/median/max)",
        ["jobs", "n", "requeued", "running", "caught up"],
        [
            [
                name,
                len(g),
                mmm([x.requeued_s for x in g]),
                mmm([x.running_s for x in g]),
                mmm([x.caught_up_s for x in g]),
            ]
            for name, g in (("single", singles), ("gang", gangs))
        ],
    )
    print(
        f"\njobs: {len(res.succeeded)} succeeded, {len(res.failed)} failed, "
        f"{len(res.stuck)} stuck, {len(res.run_twice)} run twice; "
        f"rejoins tried twice: {res.join_retries}"
    )
    for jid, why in sorted(res.failed.items()):
        print(f"  failed {jid}: {why}")
    for jid in res.stuck:
        print(f"  stuck {jid}: {res.jobs[jid]['status']} ({res.jobs[jid]['reason']})")
    for jid in res.run_twice:
        print(f"  run twice {jid}")
    print(
        f"lines lost: {sum(res.lines_lost.values())} of {res.lines_total} "
        f"({len(res.lines_lost)} jobs)"
        + "".join(f"\n  {j}: {n}" for j, n in sorted(res.lines_lost.items()))
        + f"; in flight (printed < {res.config['in_flight_s'] * 1000:g} ms before its machine's kill, or "
        f"while it died; not counted): {sum(res.lines_in_flight.values())}"
        + "".join(
            f"\n  lost {j}: {line!r}"
            + (f" ({age * 1000:.0f} ms before the kill)" if age is not None else "")
            for j, line, age in res.lost_lines[:20]
        )
        + "".join(
            f"\n  in flight {j}: {line!r} ({age * 1000:.0f} ms before the kill)"
            for j, line, age in res.in_flight_lines[:20]
        )
    )
    alive_rows = sum(r["alive"] for r in res.node_rows)
    print(
        f"nodes listed: {len(res.node_rows)} ({alive_rows} alive) vs machines alive: "
        f"{len(res.machines_alive)} ({', '.join(res.machines_alive)})"
    )
    by_machine: dict[str, list[str]] = {}
    for r in res.node_rows:
        by_machine.setdefault(str(r["machine"]), []).append(
            f"{r['node_id'][:8]}:{'alive' if r['alive'] else r['state']}"
        )
    for m, v in sorted(by_machine.items()):
        print(f"  {m}: {' '.join(v)}")
    b = res.baselines
    print(
        "\nbaselines from this run:\n"
        f"  node death detection (kill -> down), median: {fmt(b['detect_median_s'])} s; "
        f"recovery (kill -> RUNNING) / detection, median: "
        f"{fmt(b['recovery_over_detection_median'], '.2f')}x\n"
        f"  job wall (first start -> end) / ideal ({b['ideal_job_s']:.0f} s), median: "
        f"not hit {fmt(b['wall_over_ideal_unhit_median'], '.2f')}x, "
        f"hit {fmt(b['wall_over_ideal_hit_median'], '.2f')}x, "
        f"hit/not hit {fmt(b['hit_over_unhit'], '.2f')}x"
    )
    print("\ngoals (issue 20):")
    for name, g in res.goals.items():
        verdict = "N/A " if g["ok"] is None else "PASS" if g["ok"] else "FAIL"
        print(f"  {verdict}  {name}: {g['text']}")


# --------------------------------------------------------------------------- entry points


def run_chaos(cfg: ChaosConfig) -> Results:
    """Set up, load, kill and rejoin, analyse; everything it started is stopped on any exit."""
    ch = Chaos(cfg)
    try:
        ch.up()
        ch.submit()
        try:
            ch.chaos()
        except DeadlineReached:
            log(f"deadline: stopping the chaos after {len(ch.kills)} kill(s)")
        ch.wait_jobs()
        return analyse(ch)
    finally:
        _cleaning.set()
        old = None
        if threading.current_thread() is threading.main_thread():
            old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a 2nd Ctrl-C: still clean up
        try:
            if ch.poller:
                ch.poller.stop.set()
                ch.poller.join(timeout=15)
            if ch.admin:
                ch.admin.close()
            ch.down_all()
            for m in [ch.head, *ch.machines]:
                if not cfg.keep:
                    shutil.rmtree(ray_temp_dir(m.home), ignore_errors=True)
            if cfg.keep:
                log(f"kept {ch.root}")
            else:
                shutil.rmtree(ch.root, ignore_errors=True)
        finally:
            _cleaning.clear()
            if old is not None:
                signal.signal(signal.SIGINT, old)


def main() -> int:
    d = ChaosConfig()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=d.jobs)
    p.add_argument("--gangs", type=int, default=d.gangs)
    p.add_argument("--cycles", type=int, default=d.cycles)
    p.add_argument("--kill-every", type=float, default=d.kill_every)
    p.add_argument("--rejoin-after", type=float, default=d.rejoin_after)
    p.add_argument("--workers", type=int, default=d.workers)
    p.add_argument("--worker-cpus", type=int, default=d.worker_cpus)
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--interval", type=float, default=d.interval)
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every)
    p.add_argument("--max-restarts", type=int, default=d.max_restarts)
    p.add_argument("--api-port", type=int, default=0)
    p.add_argument("--json", dest="json_path")
    p.add_argument("--deadline", type=int, default=int(d.deadline))
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    if args.gangs > args.jobs or args.workers < 1 or args.cycles < 0:
        p.error("need --gangs <= --jobs, --workers >= 1, --cycles >= 0")
    cfg = ChaosConfig(
        jobs=args.jobs,
        gangs=args.gangs,
        cycles=args.cycles,
        kill_every=args.kill_every,
        rejoin_after=args.rejoin_after,
        workers=args.workers,
        worker_cpus=args.worker_cpus,
        steps=args.steps,
        interval=args.interval,
        checkpoint_every=args.checkpoint_every,
        max_restarts=args.max_restarts,
        api_port=args.api_port,
        deadline=args.deadline,
        keep=args.keep,
        json_path=args.json_path,
    )

    def on_alarm(*_):
        if not _cleaning.is_set():  # cleaning up is bounded by its own timeouts
            raise DeadlineReached()

    def on_term(*_):
        if not _cleaning.is_set():
            raise KeyboardInterrupt()

    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, on_term)  # `kill PID` cleans up like Ctrl-C
    signal.alarm(args.deadline)
    try:
        res = run_chaos(cfg)
    except DeadlineReached:
        log(f"hard deadline of {args.deadline} s reached; everything was stopped")
        return 3
    except KeyboardInterrupt:
        log("interrupted; everything was stopped")
        return 130
    finally:
        signal.alarm(0)
    report(res)
    if cfg.json_path:
        Path(cfg.json_path).write_text(json.dumps(res.to_json(), indent=2, default=str))
    return 1 if any(g["ok"] is False for g in res.goals.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
