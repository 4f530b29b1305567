"""Job traces for the simulator: Microsoft Philly, Tiresias' 60-job example, synthetic.

A `TraceJob` is one job as a trace records it: who submitted it (the team), when, how
many GPUs as one gang and how long it runs on them. Trace files are described in
shared/traces/SOURCES.md: `philly.csv` (timestamp, duration, num_gpus, gpu_time,
cluster = the VC, used as the team; rows unsorted), `philly_vc.csv` (vc, node num: the
VC sizes in 8-GPU nodes, used as team guarantees) and `60_job.csv` (job_id, num_gpu,
submit_time, iterations, model_name, duration, interval).

Invariant: loaders return jobs sorted by (submit, job_id), submit times starting at the
window's start (0 for the first job of the window), durations > 0, GPUs >= 1. Job ids are
zero-padded row numbers ("p0000042"), so that ties in submit time (broken by id, as the
policies break them) follow the trace's row order rather than "p10" < "p9". Timestamps
without a zone are read as UTC, so a replay never depends on the machine's time zone.
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

TINY_PHILLY_VCS = ("795a4c", "51b7ef", "925e2b", "23dbec")


@dataclass(frozen=True)
class TraceJob:
    job_id: str
    team: str
    submit: float  # seconds from the start of the trace window
    duration: float  # seconds of running it needs
    gpus: int  # the whole gang
    priority: int = 0

    def shape(self, gpus_per_node: int = 8) -> tuple[int, int]:
        """(workers, GPUs per worker): one worker up to a node, else node-sized workers."""
        if self.gpus <= gpus_per_node:
            return 1, self.gpus
        per = math.gcd(self.gpus, gpus_per_node)
        return self.gpus // per, per


def _utc_seconds(text: str) -> float:
    """Seconds since the epoch of an ISO timestamp, read as UTC when it names no zone."""
    t = datetime.fromisoformat(text)
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


def _sorted(jobs: list[TraceJob]) -> list[TraceJob]:
    jobs.sort(key=lambda j: (j.submit, j.job_id))
    return jobs


def load_philly_vcs(path: str | Path, drop: tuple[str, ...] = TINY_PHILLY_VCS) -> dict[str, int]:
    """VC -> its size in 8-GPU nodes, from philly_vc.csv."""
    with open(path, newline="") as f:
        rows = {r["vc"]: int(r["node num"]) for r in csv.DictReader(f)}
    return {vc: n for vc, n in rows.items() if vc not in drop}


def load_philly(
    path: str | Path,
    teams: set[str] | None = None,
    start: str = "2017-10-01",
    end: str = "2017-12-01",
) -> list[TraceJob]:
    """Jobs of philly.csv submitted in [start, end) by `teams` (all when None)."""
    t0 = _utc_seconds(start)
    jobs = []
    with open(path, newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            ts = row["timestamp"]
            if not ts or not (start <= ts < end) or (teams and row["cluster"] not in teams):
                continue
            submit = _utc_seconds(ts) - t0
            jobs.append(
                TraceJob(
                    f"p{i:07d}",
                    row["cluster"],
                    submit,
                    max(1.0, float(row["duration"])),
                    max(1, int(row["num_gpus"])),
                )
            )
    return _sorted(jobs)


def load_60_job(path: str | Path, team: str = "team") -> list[TraceJob]:
    """Tiresias' 60_job.csv, every job submitted by `team`."""
    with open(path, newline="") as f:
        return _sorted(
            [
                TraceJob(
                    f"j{int(r['job_id']):03d}",
                    team,
                    float(r["submit_time"]),
                    max(1.0, float(r["duration"])),
                    max(1, int(r["num_gpu"])),
                )
                for r in csv.DictReader(f)
            ]
        )


def synthetic(
    n_jobs: int,
    teams: dict[str, float],
    seed: int = 0,
    mean_interarrival: float = 60.0,
    gpu_sizes: tuple[tuple[int, float], ...] = (
        (1, 0.7),
        (2, 0.1),
        (4, 0.1),
        (8, 0.07),
        (16, 0.03),
    ),
    median_duration: float = 1200.0,
    sigma: float = 1.8,
) -> list[TraceJob]:
    """Seeded Philly-like jobs: Poisson arrivals, teams drawn by weight, lognormal
    (heavy-tailed) durations, mostly single-GPU gangs."""
    rng = random.Random(seed)
    names, weights = zip(*sorted(teams.items()))
    sizes, size_w = zip(*gpu_sizes)
    t, jobs = 0.0, []
    for i in range(n_jobs):
        t += rng.expovariate(1.0 / mean_interarrival)
        duration = max(1.0, median_duration * math.exp(rng.gauss(0.0, sigma)))
        jobs.append(
            TraceJob(
                f"s{i:06d}",
                rng.choices(names, weights)[0],
                round(t, 3),
                round(duration, 1),
                rng.choices(sizes, size_w)[0],
            )
        )
    return _sorted(jobs)
