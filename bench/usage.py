"""Usage ledger benchmark: reports over a million lines against the previous way of
reading them, and what the accountant adds to each job transition.

Run:   .venv/bin/python bench/usage.py                 (1,000,000 lines; ~8 min on 2 busy
                                                      cores, most of it writing the lines)
       .venv/bin/python bench/usage.py --lines 100000 --jobs 200     (small)
Options: --lines (synthetic ledger lines), --days (their end times spread over this many
         days back), --teams, --jobs (jobs run through admit/start/end for the accountant
         figures), --reps (timed repetitions; the median is printed), --seed, --json FILE.

Setup: a temporary SQLite store (WAL, as the control plane runs it) holding --lines
synthetic lines (teams, users, pools, GPU models, 1-64 GPUs, runs of a minute to a day,
one in five preempted or node-lost; one in five a replica run of one of a team's five
services)
written straight into the ledger, with their sums.

Reports (median of --reps, seconds; `previous` is the way the store read them before
this change, measured in the same run on the same store, and `ratio` is now/previous):
  report by team, 30d   UsageOps.report(admin, since=30d, by=team): GET /v1/usage, `aicluster
                        usage --by team --since 30d`. Now: one pass, whole days from the
                        per-team daily sums, the first partial day from the index covering the
                        lines' sums. Previous (PreviousOps over PreviousUsage: the same
                        layers): two passes (the total, then the groups), whole days from
                        the per-(team, user, pool, GPU model) daily sums, the partial day's
                        lines read from their rows through the plain ended_at index.
  report one team by user  the same for a member (one team, by user); the fine daily sums.
  report by service, 30d  by service (admin): whole days from the per-(team, service) daily
                        sums. Previous: there were none; every line of the window read.
Write path (seconds per job transition; ratio against one transition):
  job transition        compare-and-set + event, the loop's unit of work
  accountant added      the accountant's steps over --jobs jobs of three transitions each
                        (lines, both daily sums, the cursor), divided by the transitions
  accountant idle       one accountant step with no new events (its cost on a quiet tick)
  replica transition    a replica's compare-and-set + event (placement: + its run's facts),
                        over --jobs replicas placed, made ready and stopped
  accountant added (replicas)  the accountant's steps over those replica runs, divided by
                        their transitions
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import text

from aicluster.control.usage import Accountant, UsageOps, parse_since, total_json
from aicluster.core.lifecycle import JobStatus as S
from aicluster.core.lifecycle import Reason
from aicluster.core.replica import ReplicaReason as RR
from aicluster.core.replica import ReplicaStatus as RS
from aicluster.engine.protocol import NodeInfo
from aicluster.specs.job import JobSpec
from aicluster.specs.service import ServiceSpec
from aicluster.store import open_store
from aicluster.store.identity import Principal
from aicluster.store.services import ServiceStore
from aicluster.store.usage import (
    DAILY_GROUPS,
    DAY,
    LOST,
    SUMS,
    UsageStore,
    _merged,
    _ordered,
)

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
        replica = rnd.random() < 0.2
        yield dict(
            job_id=f"replica:svc-{i:07d}" if replica else f"job-{i:07d}",
            attempt=1,
            kind="replica" if replica else "job",
            service=f"svc-{team[-2:]}-{rnd.randrange(5)}" if replica else None,
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
    acct.catalog.gpu_hour("H100")  # the planner catalog, loaded once per control plane
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


def replica_figures(store, usage: UsageStore, runs: int) -> tuple[float, float]:
    """(seconds per replica transition, accountant seconds added per transition)."""
    node = NodeInfo("n1", "n1", "n1", True, 64.0, 512 * GiB, 8, "L40S", "l40s-serve")
    acct = Accountant(usage, nodes=lambda: [node], every_s=0)
    while acct.step() or usage.cursor() < _last_event(store):
        pass
    services = ServiceStore(store)
    spec = ServiceSpec(name="bench-svc", team="team-00", model="m", resources={"gpus": 1})
    svc = services.create(spec, "bench")
    ids = [services.add_replica(svc).id for _ in range(runs)]
    t = time.perf_counter()
    for rid in ids:
        services.transition(rid, RS.PENDING, RS.STARTING, RR.PLACED, node_id="n1")
        services.transition(rid, RS.STARTING, RS.READY, RR.HEALTHY)
        services.transition(rid, RS.READY, RS.STOPPED, RR.SCALED_DOWN)
    per_transition = (time.perf_counter() - t) / (3 * runs)
    t = time.perf_counter()
    written = 0
    while (n := acct.step()) or usage.cursor() < _last_event(store):
        written += n
    added = (time.perf_counter() - t) / (3 * runs)
    assert written == runs, (written, runs)
    return per_transition, added


def _last_event(store) -> int:
    with store.engine.connect() as conn:
        return conn.exec_driver_sql("SELECT max(id) FROM events").scalar() or 0


# -- the previous way of reading a report (before the per-team daily sums and the index
# covering the lines' sums), through the same layers: UsageOps and UsageStore ------------


class PreviousUsage(UsageStore):
    """The store's reads as they were: whole days from the per-(team, user, pool, GPU
    model) daily sums whatever the grouping; the partial day's lines through the plain
    ended_at index (the (team, ended_at) index for one team), from the lines' rows."""

    def totals(self, by, since=None, until=None, team=None):
        if until is not None or (by is not None and by not in DAILY_GROUPS):
            return super().totals(by, since, 1e18 if until is None else until, team)
        first_day = None if since is None else math.ceil(since / DAY)
        parts = self._daily_totals(by, first_day, team)
        if since is not None:
            parts += self._line_totals(by, since, first_day * DAY, team)
        return _ordered(_merged(parts, by))

    def _line_totals(self, by, since, until, team) -> list[tuple]:
        lost = ", ".join(f"'{c}'" for c in LOST)
        key = f"{by}, " if by else "NULL, "
        sql = (
            f"SELECT {key}count(*), sum(run_ms), sum(gpu_ms), sum(cpu_ms), "
            f"sum(memory_gib_ms), sum(CASE WHEN end_reason IN ({lost}) THEN gpu_ms ELSE 0 "
            "END), sum(cost_micros) FROM usage_lines"
            + ("" if team else " INDEXED BY ix_usage_lines_ended_at")
            + " WHERE ended_at >= :since AND ended_at < :until"
            + (" AND team = :team" if team else "")
            + (f" GROUP BY {by}" if by else "")
        )
        with self._session() as s:
            rows = s.execute(text(sql), {"since": since, "until": until, "team": team}).all()
        return [tuple(r) for r in rows]


class PreviousOps(UsageOps):
    """UsageOps.report as it was: two passes, the grand total and then the groups."""

    def report(self, who, since, team, by):
        start = parse_since(since, self.usage.clock())
        team = self._scope(who, team)
        (total,) = self.usage.totals(None, start, None, team)
        groups = self.usage.totals(by, start, None, team)
        return {
            "since": start,
            "team": team,
            "by": by,
            "groups": [total_json(g) for g in groups],
            "total": total_json(total),
        }


def same_figures(report: dict, previous: dict) -> bool:
    def figures(r):
        return {g["key"]: [g[n] for n in SUMS] for g in r["groups"]}, [r["total"][n] for n in SUMS]

    return figures(report) == figures(previous)


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
        with store.engine.begin() as conn:  # the index the previous reads went through
            conn.exec_driver_sql("CREATE INDEX ix_usage_lines_ended_at ON usage_lines (ended_at)")
        ops = UsageOps(usage, store.team_exists)
        before = PreviousOps(PreviousUsage(store), store.team_exists)
        admin = Principal("admin", None, "admin")
        member = Principal("m", "team-07", "member")
        reports = {}  # name -> (now seconds, previous seconds)
        for name, who, by in (
            ("report by team, 30d (admin)", admin, "team"),
            ("report one team by user, 30d", member, "user"),
            ("report by service, 30d (admin)", admin, "service"),
        ):
            now_, then = ops.report(who, "30d", None, by), before.report(who, "30d", None, by)
            assert same_figures(now_, then), f"{name}: the two ways disagree"
            reports[name] = (
                timed(lambda w=who, b=by: ops.report(w, "30d", None, b), args.reps),
                timed(lambda w=who, b=by: before.report(w, "30d", None, b), args.reps),
            )
        tr, added, idle = accountant_figures(store, usage, args.jobs)
        rtr, radded = replica_figures(store, usage, args.jobs)
        store.close()

    print(f"{args.lines:,} ledger lines (written in {fill_s:.1f} s), {args.jobs} jobs accounted")
    print(f"{'report':32} {'now s':>10} {'previous s':>11} {'ratio':>8} {'goal':>9}")
    for name, (now, before) in reports.items():
        goal = "< 0.200" + (" ok" if now < 0.2 else " NO") if "by team" in name else ""
        print(f"{name:32} {now:10.4f} {before:11.4f} {now / before:8.3f} {goal:>9}")
    print(f"{'write path, per transition':32} {'seconds':>10} {'x transition':>12} {'goal':>9}")
    for name, secs in (
        ("job transition (baseline)", tr),
        ("accountant added", added),
        ("accountant step, nothing new", idle),
        ("replica transition", rtr),
        ("accountant added (replicas)", radded),
    ):
        added_ = name.startswith("accountant added")
        goal = "< 0.001" + (" ok" if secs < 0.001 else " NO") if added_ else ""
        print(f"{name:32} {secs:10.6f} {secs / tr:12.3f} {goal:>9}")
    print("ratio: now / previous (same store, same run); the figures of both ways are equal")
    if args.json:
        flat = {
            f"{k} ({w})": v
            for k, pair in reports.items()
            for w, v in zip(("now", "previous"), pair)
        }
        flat.update({"job transition": tr, "accountant added": added, "accountant idle": idle})
        flat.update({"replica transition": rtr, "accountant added (replicas)": radded})
        args.json.write_text(json.dumps({"lines": args.lines, "fill_s": fill_s, **flat}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
