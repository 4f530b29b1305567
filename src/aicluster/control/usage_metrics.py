"""Prometheus series of usage and queue wait per team, read from the state store at
scrape time (registered with control.metrics.Metrics.add_state, like StateCollector).

- `aicluster_usage_gpu_seconds_total{team}` and `aicluster_usage_cost_usd_total{team}`:
  counters, the ledger's per-team sums since it began (store.usage_series.team_totals:
  one row a team from the daily sums, cheap at any scrape rate). They only grow, as the
  ledger only gains lines; `increase(...[1d])` is a team's use over a day.
- `aicluster_queue_wait_seconds{team}`: a histogram of the wait from PENDING to
  admission of every admission the collector has read from the event log; it reads on
  from its cursor (an event id) at each scrape, at most `batch` admissions at a time,
  and starts with the admissions of the last `backfill_s` seconds.

Every series carries `team`, so a member's scrape (control.metrics.TeamView) shows its
own team's alone.
"""

from __future__ import annotations

import threading

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily

from aicluster.store.usage_series import UsageSeriesStore

WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)


class UsageCollector:
    def __init__(self, series: UsageSeriesStore, backfill_s: float = 86400.0, batch: int = 10000):
        self.series, self.backfill_s, self.batch = series, backfill_s, batch
        self.waits = Histogram(
            "aicluster_queue_wait_seconds",
            "Wait from PENDING (submission or requeue) to admission, per team",
            ["team"],
            registry=None,
            buckets=WAIT_BUCKETS,
        )
        self._after: int | None = None  # the last admission event read; None: not yet
        self._lock = threading.Lock()

    def describe(self):
        return []

    def collect(self):
        gpu = CounterMetricFamily(
            "aicluster_usage_gpu_seconds",
            "GPU-seconds of ended job attempts per team (the usage ledger)",
            labels=["team"],
        )
        cost = CounterMetricFamily(
            "aicluster_usage_cost_usd",
            "Cost of ended job attempts per team at the prices in force (the usage ledger)",
            labels=["team"],
        )
        for team, (gpu_ms, cost_micros) in sorted(self.series.team_totals().items()):
            gpu.add_metric([team], gpu_ms / 1000)
            cost.add_metric([team], cost_micros / 1e6)
        yield gpu
        yield cost
        self._read_waits()
        yield from self.waits.collect()

    def _read_waits(self) -> None:
        with self._lock:  # two scrapes at once must not observe an admission twice
            if self._after is None:
                since = self.series.clock() - self.backfill_s
                got = self.series.admissions(since=since, limit=self.batch)
            else:
                got = self.series.admissions(after_id=self._after, limit=self.batch)
            for a in got:
                self.waits.labels(a.team).observe(a.wait_s)
            if got:
                self._after = got[-1].event_id
            elif self._after is None:  # nothing to backfill: read on from the newest event
                self._after = self.series.last_event_id()
