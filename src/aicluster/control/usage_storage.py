"""Storage in the usage ledger: the leader samples the bytes each team keeps once a UTC
day (store.usage_storage), and reports price them per GiB-month.

Vocabulary: `artifacts` are the distinct blobs (manifests included) of a team's dataset
and model versions, `checkpoints` those of its checkpoint versions (each counted once per
team and kind, however many versions share it), `logs` the bytes of the logs the control
plane keeps of the team's jobs and replicas (in the state store, and in the log folder of
an installation from before that). *GiB-days*: each day's sample, in GiB, for
the day it stands for; *storage_gib_month*: the price of one GiB kept for a month (730 h),
from an admin's price of scope (every pool, every GPU model) in force when the sample was
taken; none set: storage costs 0.

Invariants: sampling is idempotent (a day's sample replaces that day's rows); it runs off
the reconcile loop's thread, once a UTC day, and on demand (`sample()`); a report's storage
total is the sum of its teams, each team's cost the sum of its days' rounded costs.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from aicluster.core.replica import ReplicaId
from aicluster.store.usage import PriceRecord
from aicluster.store.usage_storage import DAY, KINDS, StorageSample, StorageSamples

log = logging.getLogger(__name__)
GiB = 2**30
HOURS_PER_MONTH = 730.0  # as the planner's: 8760 h / 12


class StorageSampler:
    """Takes the day's sample when the leader's loop ticks on a day not sampled yet.
    `artifacts`: the artifact repository (store.artifacts.ArtifactStore) or None;
    `logs_root`: control.logs.LogStore's folder or None."""

    def __init__(
        self,
        samples: StorageSamples,
        artifacts=None,
        logs_root: Path | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.samples, self.artifacts, self.logs_root = samples, artifacts, logs_root
        self.clock = clock
        self.done_day: int | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._running: Future | None = None

    def tick(self) -> None:
        """Start the day's sample in the background unless it is taken or under way."""
        day = math.floor(self.clock() / DAY)
        if self.done_day == day or (self._running is not None and not self._running.done()):
            return
        if self.done_day is None and self.samples.last_day() == day:  # before a restart
            self.done_day = day
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="storage-sample")
        self._running = self._pool.submit(self._sample_logged, day)

    def _sample_logged(self, day: int) -> None:
        try:
            self.sample(day)
        except Exception:  # the next tick tries again
            log.exception("storage sample of day %d failed", day)

    def sample(self, day: int | None = None) -> dict[tuple[str, str], int]:
        """Measure every team's bytes now and store them as the sample of `day` (today)."""
        day = math.floor(self.clock() / DAY) if day is None else day
        got = self._artifact_bytes()
        for team, n in self._log_bytes().items():
            got[(team, "logs")] = got.get((team, "logs"), 0) + n
        self.samples.put(day, got)
        self.done_day = day
        return got

    def _artifact_bytes(self) -> dict[tuple[str, str], int]:
        if self.artifacts is None:
            return {}
        from aicluster.artifacts.chunks import blob_sizes
        from aicluster.artifacts.manifest import Manifest

        out = {}
        for key, manifests in self.samples.artifact_manifests().items():
            sizes: dict[str, int] = {}
            for digest in manifests:
                try:
                    data = self.artifacts.backend.read_bytes(digest)
                except FileNotFoundError:  # deleted since the query
                    continue
                sizes[digest] = len(data)
                sizes.update(blob_sizes(Manifest.from_json(data).files))
            out[key] = sum(sizes.values())
        return out

    def _log_bytes(self) -> dict[str, int]:
        """Team -> bytes of the logs of its jobs (by job id) and replicas (by gang id): in
        the state store (store.jobfiles) and in the log folder (`logs_root`: a folder per
        id); logs of unknown workloads are not counted."""
        sizes = self.samples.stored_log_sizes()
        root = self.logs_root
        if root is not None and root.is_dir():
            for d in root.iterdir():
                if d.is_dir():
                    n = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
                    sizes[d.name] = sizes.get(d.name, 0) + n
        replicas = {d: r.value for d in sizes if (r := ReplicaId.from_gang_id(d)) is not None}
        jobs, runs = self.samples.owners(list(sizes), list(replicas.values()))
        out: dict[str, int] = {}
        for name, n in sizes.items():
            team = jobs.get(name) or runs.get(replicas.get(name, ""))
            if team is not None:
                out[team] = out.get(team, 0) + n
        return out


def storage_rate(prices: list[PriceRecord], at: float) -> float:
    """The storage_gib_month in force at `at` (scope: every pool and GPU model), else 0."""
    rows = [
        p
        for p in prices
        if p.pool is None
        and p.gpu_model is None
        and p.storage_gib_month is not None
        and p.effective_from <= at
    ]
    best = max(rows, key=lambda p: (p.effective_from, p.id), default=None)
    return best.storage_gib_month if best is not None else 0.0


def day_cost_micros(nbytes: int, rate: float) -> int:
    """A day's storage cost in micro-units: GiB x rate per month / days per month."""
    return round(nbytes / GiB * rate * 24 / HOURS_PER_MONTH * 1e6)


def storage_report(
    samples: StorageSamples, prices: list[PriceRecord], since: float, team: str | None
) -> dict:
    """Per team: the bytes of its latest sample (per kind), its GiB-days and their cost
    over the sample days from `since` on; and their total."""
    first_day = math.ceil(since / DAY)
    teams: dict[str, dict] = {}

    def entry(t: str) -> dict:
        return teams.setdefault(
            t,
            {"key": t, "bytes": 0, **{f"{k}_bytes": 0 for k in KINDS}, "byte_days": 0}
            | {"days": set(), "cost_micros": 0, "sampled_day": None},
        )

    for s in samples.latest(team):
        e = entry(s.team)
        e["bytes"] += s.bytes
        e[f"{s.kind}_bytes"] += s.bytes
        e["sampled_day"] = s.day
    for s in samples.samples(first_day, team):
        e = entry(s.team)
        rate = storage_rate(prices, s.sampled_at)
        e["byte_days"] += s.bytes
        e["cost_micros"] += day_cost_micros(s.bytes, rate)
        e["days"].add(s.day)
    groups = [_finish(e) for e in teams.values()]
    groups.sort(key=lambda g: (-g["cost_micros"], -g["bytes"], g["key"]))
    total = {
        n: sum(g[n] for g in groups)
        for n in ("bytes", *(f"{k}_bytes" for k in KINDS), "byte_days", "cost_micros")
    }
    return {"groups": groups, "total": _finish_total(total)}


def _finish(e: dict) -> dict:
    e = dict(e, days=len(e["days"]))
    e["sampled_at_day"] = e.pop("sampled_day")
    return _finish_total(e)


def _finish_total(d: dict) -> dict:
    return dict(d, gib=d["bytes"] / GiB, gib_days=d["byte_days"] / GiB, cost=d["cost_micros"] / 1e6)


__all__ = ["StorageSample", "StorageSampler", "storage_report", "storage_rate"]
