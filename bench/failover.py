"""Failover benchmark: two control-plane replicas on one PostgreSQL; the leader dies or
freezes under a stream of submissions and a client polling the API.

Run:   .venv/bin/python bench/failover.py                 (~1.5-2 min on a 2-core machine)
       .venv/bin/python bench/failover.py --rounds 3      (more kills per scenario)
Options: --lease-ttl/--lease-renew (the replicas' lease, default 3 s / 1 s as `aicluster up`),
         --settle (seconds every replica runs before a kill, default 10),
         --poll-ms (the client's period, default 50), --submit-ms (one job every, default
         250), --json FILE, --deadline SECONDS (hard bound, default 600), --keep (keep the
         temp folder and the replicas' logs).
Needs PostgreSQL 15's binaries (/usr/lib/postgresql/15/bin, as the tests: `make test`
installs them).

Everything is private and on loopback: a PostgreSQL started with tests/pgserver.py's
PgServer in a temp folder; a Ray cluster of its own (ray.cluster_utils.Cluster: a head
without CPUs and one 4-CPU node); two real control planes (`python -m aicluster.api.server`,
tests/harness.py's ControlPlaneProc) sharing one AICLUSTER_HOME and the database. Every
process it started is stopped at the end, also on errors and on --deadline.

Scenarios, each --rounds times, with short jobs (`true`, 0.25 CPU) submitted every
--submit-ms to either replica (retried on the other) so the queue is never idle:
- kill -9: SIGKILL of the leader's process. The follower is on the same host and sees the
  holder's process gone, so it takes over at its next try (<= --lease-renew), without
  waiting out the TTL. The killed replica is started again (as a follower) afterwards.
- SIGSTOP: the leader is frozen, as a leader whose machine or network is lost looks from
  elsewhere: the follower waits out the lease (TTL), then takes over. SIGCONT afterwards;
  the old leader must find its lease gone and lead no more.
Measured from the signal: the new leader elected (the lease's acquired_at, on the
database's clock), and its first admission (the first ADMITTED event after the signal);
the goal is <= 5 s. A client polls GET /v1/jobs every --poll-ms, alternating between the
replicas, with a 0.5 s timeout; on an error it retries once on the other replica. Reported:
raw errors (first tries that failed) and errors seen by the client (both tries failed);
the goal is 0 seen.
"""

from __future__ import annotations

import argparse
import json
import os
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
sys.path.insert(0, str(ROOT / "tests"))  # harness.py and pgserver.py: the tests' real parts

from aicluster.engine.rayenv import ray_env

GOAL_FAILOVER_S = 5.0


class DeadlineReached(Exception):
    pass


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Poller(threading.Thread):
    """GET /v1/jobs?limit=1 every period on alternating replicas, retrying on the other."""

    def __init__(self, replicas, token: str, period_s: float):
        super().__init__(daemon=True)
        import httpx

        self.urls = [r.url for r in replicas]
        self.http = httpx.Client(timeout=0.5, headers={"Authorization": f"Bearer {token}"})
        self.period_s = period_s
        self.polls = self.raw_errors = self.seen_errors = 0
        self.stop = threading.Event()

    def _ok(self, url: str) -> bool:
        try:
            return self.http.get(url + "/v1/jobs", params={"limit": 1}).status_code == 200
        except Exception:  # noqa: BLE001 - refused, reset, timed out: an error all the same
            return False

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            began = time.monotonic()
            first, other = self.urls[i % 2], self.urls[(i + 1) % 2]
            i += 1
            self.polls += 1
            if not self._ok(first):
                self.raw_errors += 1
                if not self._ok(other):
                    self.seen_errors += 1
            self.stop.wait(max(0.0, self.period_s - (time.monotonic() - began)))


class Submitter(threading.Thread):
    """A short job every period, to either replica, retried on the other."""

    def __init__(self, replicas, period_s: float):
        super().__init__(daemon=True)
        self.replicas, self.period_s = replicas, period_s
        self.submitted = self.failed = 0
        self.stop = threading.Event()

    def run(self) -> None:
        i = 0
        spec = {"kind": "job", "name": "f", "resources": {"cpus": 0.25}, "command": "true"}
        while not self.stop.is_set():
            i += 1
            for cp in (self.replicas[i % 2], self.replicas[(i + 1) % 2]):
                try:
                    cp.client().submit({**spec, "name": f"f{i}"}, None)
                    self.submitted += 1
                    break
                except Exception:  # noqa: BLE001 - that replica is down: the other one
                    continue
            else:
                self.failed += 1
            self.stop.wait(self.period_s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=1, help="kills per scenario")
    ap.add_argument("--lease-ttl", type=float, default=3.0)
    ap.add_argument("--lease-renew", type=float, default=1.0)
    ap.add_argument("--poll-ms", type=float, default=50)
    ap.add_argument("--submit-ms", type=float, default=250)
    ap.add_argument(
        "--settle",
        type=float,
        default=10.0,
        help="seconds every replica has run before a kill (a replica that has just started "
        "is still warming up: its first tick as leader is slower)",
    )
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--deadline", type=int, default=600, help="hard bound on the whole run (s)")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder (logs)")
    args = ap.parse_args()
    if not 0 < args.lease_renew < args.lease_ttl:
        ap.error("--lease-renew must be positive and shorter than --lease-ttl")

    folder = Path(tempfile.mkdtemp(prefix="aic-failover-"))
    os.environ.update(ray_env(folder / "ray-session"))  # before `import ray`

    def on_alarm(*_):
        raise DeadlineReached(f"--deadline {args.deadline}s reached")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(args.deadline)

    from pgserver import PgServer
    from sqlalchemy import create_engine, text

    from aicluster.store.db import state_url

    from harness import COMMON_NODE_ARGS, ControlPlaneProc, free_port, wait_for

    print(
        f"failover benchmark: {folder}, load average {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} CPUs; lease TTL {args.lease_ttl:g} s, renew {args.lease_renew:g} s"
    )
    pg = cluster = db = None
    replicas: list = []
    threads: list = []
    rows: list[dict] = []
    try:
        log("starting PostgreSQL and Ray (a head and one 4-CPU node)")
        pg_folder = Path(tempfile.mkdtemp(prefix="aic-failover-pg-"))  # its own: chowned
        pg = PgServer(pg_folder)
        pg.start()
        url = pg.create_database()
        db = create_engine(state_url(url))
        from ray.cluster_utils import Cluster

        cluster = Cluster(
            initialize_head=True,
            connect=False,
            head_node_args=dict(num_cpus=0, num_gpus=0, **COMMON_NODE_ARGS),
        )
        cluster.add_node(num_cpus=4, **COMMON_NODE_ARGS)
        cluster.wait_for_nodes()
        lease_args = (
            "--lease-ttl",
            f"{args.lease_ttl:g}",
            "--lease-renew",
            f"{args.lease_renew:g}",
        )
        for name in ("a", "b"):
            cp = ControlPlaneProc(
                folder / "home",
                cluster.address,
                free_port(),
                args=lease_args,
                env={"AICLUSTER_STATE": url},
                log_name=f"controlplane-{name}.log",
            )
            cp.start()
            replicas.append(cp)
        token = replicas[0].admin_token

        def lease():
            with db.connect() as conn:
                return conn.execute(
                    text("SELECT holder, epoch, acquired_at FROM leader_lease")
                ).one()

        def leader():
            holder = lease()[0]
            pid = int(holder.rsplit(":", 2)[1])
            return next(cp for cp in replicas if cp.proc.pid == pid)

        wait_for(lambda: lease() is not None, timeout=30, what="a leader")
        started = time.time()  # the last replica (re)started
        poller = Poller(replicas, token, args.poll_ms / 1000)
        submitter = Submitter(replicas, args.submit_ms / 1000)
        threads = [poller, submitter]
        for t in threads:
            t.start()
        wait_for(lambda: _admissions_after(db, text, 0) is not None, timeout=60, what="work")
        for scenario in ("kill -9", "SIGSTOP"):
            for _ in range(args.rounds):
                time.sleep(max(2 * args.lease_renew, args.settle - (time.time() - started)))
                old = leader()
                epoch = lease()[1]
                errors_before = (poller.raw_errors, poller.seen_errors, poller.polls)
                log(f"{scenario} of the leader (pid {old.proc.pid}, epoch {epoch})")
                t0 = time.time()
                if scenario == "kill -9":
                    old.kill9()
                else:
                    os.killpg(old.proc.pid, signal.SIGSTOP)
                try:
                    wait_for(
                        lambda epoch=epoch: lease()[1] > epoch,
                        timeout=30,
                        interval=0.02,
                        what="a new leader",
                    )
                    elected = lease()[2] - t0
                    first = wait_for(
                        lambda t0=t0: _admissions_after(db, text, t0),
                        timeout=30,
                        interval=0.02,
                        what="an admission by the new leader",
                    )
                    time.sleep(1.0)  # the client's view settles
                finally:
                    if scenario == "SIGSTOP":
                        os.killpg(old.proc.pid, signal.SIGCONT)
                rows.append(
                    dict(
                        scenario=scenario,
                        elected_s=round(elected, 3),
                        first_admission_s=round(first - t0, 3),
                        polls=poller.polls - errors_before[2],
                        raw_errors=poller.raw_errors - errors_before[0],
                        seen_errors=poller.seen_errors - errors_before[1],
                    )
                )
                log(f"  -> {rows[-1]}")
                if scenario == "kill -9":
                    old.start()  # back as a follower
                    started = time.time()
                else:
                    old_log = old.home / old.log_name
                    wait_for(
                        lambda f=old_log: "leadership_lost" in f.read_text(errors="replace"),
                        timeout=30,
                        what="the old leader to step down",
                    )
        for t in threads:
            t.stop.set()
        _report(rows, args, submitter)
        if args.json:
            args.json.write_text(json.dumps({"rows": rows, "args": vars(args)}, default=str))
    finally:
        signal.alarm(0)
        for t in threads:
            t.stop.set()
        for cp in replicas:
            if cp.proc and cp.proc.poll() is None:
                os.killpg(cp.proc.pid, signal.SIGCONT)
                cp.stop()
        if db is not None:
            db.dispose()
        if cluster is not None:
            cluster.shutdown()
        if pg is not None:
            pg.stop()
            shutil.rmtree(pg.folder, ignore_errors=True)
        if args.keep:
            print(f"kept {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)


def _admissions_after(db, text, t0: float) -> float | None:
    with db.connect() as conn:
        return conn.execute(
            text(
                "SELECT min(ts) FROM events WHERE type = 'JobTransition' "
                "AND to_status = 'ADMITTED' AND ts > :t0"
            ),
            {"t0": t0},
        ).scalar()


def _report(rows: list[dict], args, submitter) -> None:
    print()
    head = (
        f"{'scenario':<9} {'elected (s)':>11} {'1st admit (s)':>13} {'/ goal 5 s':>10} "
        f"{'/ TTL':>6} {'polls':>6} {'raw err':>7} {'seen err':>8}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['scenario']:<9} {r['elected_s']:>11.2f} {r['first_admission_s']:>13.2f} "
            f"{r['first_admission_s'] / GOAL_FAILOVER_S:>10.2f} "
            f"{r['first_admission_s'] / args.lease_ttl:>6.2f} {r['polls']:>6} "
            f"{r['raw_errors']:>7} {r['seen_errors']:>8}"
        )
    for scenario in ("kill -9", "SIGSTOP"):
        mine = [r["first_admission_s"] for r in rows if r["scenario"] == scenario]
        if mine:
            print(
                f"{scenario}: first admission median {statistics.median(mine):.2f} s, max "
                f"{max(mine):.2f} s (goal <= {GOAL_FAILOVER_S:g} s: "
                f"{'met' if max(mine) <= GOAL_FAILOVER_S else 'MISSED'})"
            )
    seen = sum(r["seen_errors"] for r in rows)
    print(
        f"API errors seen by the client: {seen} (goal 0: {'met' if seen == 0 else 'MISSED'}); "
        f"jobs submitted {submitter.submitted}, submissions failed on both replicas "
        f"{submitter.failed}"
    )


if __name__ == "__main__":
    main()
