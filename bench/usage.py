"""Usage ledger benchmark: reports over a million lines, and what the accountant adds to
each job transition.

Run:   .venv/bin/python bench/usage.py                 (1,000,000 lines; ~5 min on 2 cores,
                                                      most of it writing the lines)
       .venv/bin/python bench/usage.py --lines 100000 --jobs 200     (small)
Options: --lines (synthetic ledger lines), --days (their end times spread over this many
         days back), --teams, --jobs (jobs run through admit/start/end for the accountant
         figures), --reps (timed repetitions; the median is printed), --seed, --json FILE.

Setup: a temporary SQLite store (WAL, as the control plane runs it) holding --lines
synthetic lines (teams, users, pools, GPU models, 1-64 GPUs, runs of a minute to a day,
one in five preempted or node-lost) written straight into the ledger.

Printed (median of --reps, seconds, and the ratio to the baseline of the same run):
  baseline         SELECT count(*) over the ledger (a full count of the same table)
  report by team   UsageOps.report(admin, since=30d, by=team): what GET /v1/usage runs
  from the lines   the same sums read from every line (no daily sums): what they save
  report one team  the same for a member (one team, by user): the (team, ended_at) index
  transition       one job transition (compare-and-set + event), the loop's unit of work
  accountant/tr.   the accountant's added time per job transition (its steps over --jobs
                   jobs of three transitions each, divided by the transitions)
  accountant idle  one accountant step with no new events (its cost on a quiet tick)
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from aicluster.control.usage import Accountant, UsageOps
from aicluster.core.lifecycle import JobStatus as S
from aicluster.core.lifecycle import Reason
from aicluster.engine.protocol import NodeInfo
from aicluster.specs.job import JobSpec
from aicluster.store import open_store
from aicluster.store.identity import Principal
from aicluster.store.usage import UsageStore

GiB = 2**30
POOLS = {"h100-train": "H100", "a100-train": "A100", "l40s-serve": "L40S", "cpu": None}
ENDS = ["completed"] * 7 + ["exit_code", "preempted", "node_lost"]


def synthetic_lines(n: int, days: float, teams: int, now: float, seed: int):
    rnd = random.Random(seed)
    pools = list(POOLS)
    for i in range(n):
        team = f"team-{rnd.randrange(teams):02d}"
        pool = rnd.choice(pools)
        workers = rnd.choice((1, 1, 1, 2, 4, 8))
        gpus = 0 if POOLS[pool] is None else workers * rnd.choice((1, 2, 4, 8))
        run_ms = rnd.randrange(60_000, 86_400_000)
        ended = now - rnd.random() * days * 86400
        cpus = workers * 8.0
        memory = workers * 64 * GiB
        yield dict(
            job_id=f"job-{i:07d}",
            attempt=1,
            team=team,
            user=f"{team}-u{rnd.randrange(10)}",
            pool=pool,
            gpu_model=POOLS[pool],
            nodes=[f"node-{rnd.randrange(500):03d}"] * workers,
            workers=workers,
            gpus=gpus,
            cpus=cpus,
            memory=memory,
            admitted_at=ended - run_ms / 1000 - 5,
            started_at=ended - run_ms / 1000,
            ended_at=ended,
            end_reason=rnd.choice(ENDS),
            run_ms=run_ms,
            gpu_ms=gpus * run_ms,
            cpu_ms=round(cpus * run_ms),
            memory_gib_ms=workers * 64 * run_ms,
            gpu_hour=2.0,
            cpu_hour=0.0,
            memory_gib_hour=0.0,
            price_source="set",
            cost_micros=round(gpus * run_ms * 2.0 / 3.6),
            accounted_at=ended,
        )


def timed(fn, reps: int) -> float:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def fill(usage: UsageStore, lines, chunk: int = 50_000) -> None:
    batch = []
    for line in lines:
        batch.append(line)
        if len(batch) == chunk:
            usage.add_lines(batch)
            batch = []
    if batch:
        usage.add_lines(batch)


def accountant_figures(store, usage: UsageStore, jobs: int) -> tuple[float, float, float]:
    """(seconds per transition, accountant seconds added per transition, idle step)."""
    node = NodeInfo("n1", "n1", "n1", True, 64.0, 512 * GiB, 8, "H100", "h100-train")
    acct = Accountant(usage, nodes=lambda: [node], every_s=0)
    acct.step()  # the cursor past the set-up's events
    spec = JobSpec(name="b", team="team-00", resources={"gpus": 1}, command="true")
    ids = [store.create_job(spec, "bench").id for _ in range(jobs)]
    t = time.perf_counter()
    for jid in ids:
        store.transition(jid, S.PENDING, S.ADMITTED, Reason.ADMITTED, attempt=1, placement=["n1"])
        store.transition(jid, S.ADMITTED, S.RUNNING, Reason.STARTED)
        store.transition(jid, S.RUNNING, S.SUCCEEDED, Reason.COMPLETED)
    per_transition = (time.perf_counter() - t) / (3 * jobs)
    t = time.perf_counter()
    written = 0
    while (n := acct.step()) or usage.cursor() < _last_event(store):
        written += n
    added = (time.perf_counter() - t) / (3 * jobs)
    assert written == jobs, (written, jobs)
    return per_transition, added, timed(acct.step, 20)


def _last_event(store) -> int:
    with store.engine.connect() as conn:
        return conn.exec_driver_sql("SELECT max(id) FROM events").scalar() or 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lines", type=int, default=1_000_000)
    p.add_argument("--days", type=float, default=60.0)
    p.add_argument("--teams", type=int, default=40)
    p.add_argument("--jobs", type=int, default=500)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="aic-bench-usage-") as tmp:
        store = open_store(Path(tmp) / "state.db")
        usage = UsageStore(store)
        for i in range(args.teams):
            store.create_team(f"team-{i:02d}")
        t = time.perf_counter()
        fill(usage, synthetic_lines(args.lines, args.days, args.teams, time.time(), args.seed))
        fill_s = time.perf_counter() - t
        ops = UsageOps(usage, store.team_exists)
        admin = Principal("admin", None, "admin")
        member = Principal("m", "team-07", "member")

        def count():
            with store.engine.connect() as conn:
                return conn.exec_driver_sql("SELECT count(*) FROM usage_lines").scalar()

        rows = {"baseline: SELECT count(*)": timed(count, args.reps)}
        rows["report by team, 30d (admin)"] = timed(
            lambda: ops.report(admin, "30d", None, "team"), args.reps
        )
        since = time.time() - 30 * 86400
        rows["same from the lines alone"] = timed(
            lambda: usage.totals("team", since, time.time() + 1), args.reps
        )
        rows["report one team by user, 30d"] = timed(
            lambda: ops.report(member, "30d", None, "user"), args.reps
        )
        tr, added, idle = accountant_figures(store, usage, args.jobs)
        rows["job transition (baseline 2)"] = tr
        rows["accountant added per transition"] = added
        rows["accountant step, nothing new"] = idle
        store.close()

    base, base2 = rows["baseline: SELECT count(*)"], rows["job transition (baseline 2)"]
    print(f"{args.lines:,} ledger lines (written in {fill_s:.1f} s), {args.jobs} jobs accounted")
    print(f"{'measure':36} {'seconds':>12} {'ratio':>10}")
    for name, secs in rows.items():
        ref = base2 if ("transition" in name or "accountant" in name) else base
        print(f"{name:36} {secs:12.6f} {secs / ref:10.3f}")
    print("ratios: reports against the count, accountant figures against one transition")
    if args.json:
        args.json.write_text(json.dumps({"lines": args.lines, "fill_s": fill_s, **rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
