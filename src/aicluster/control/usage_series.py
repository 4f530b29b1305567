"""Usage over time, per team: the operations behind `GET /v1/usage/series`.

Vocabulary: a *metric* is what a point measures: `gpu_hours` and `cost_usd` (the usage
ledger's per-team daily sums of the lines that ended in the bucket) or `queue_wait_s`
(the mean wait from PENDING to admission of the jobs admitted in the bucket; each
point also has the max and the number of admissions). A *bucket* is [start, start +
step); buckets are aligned to multiples of the step since the UNIX epoch (whole UTC days
for a step of days), the first is the one `since` falls in, the last the one now falls
in. A *series* is one team's points, one per bucket, oldest first.

Invariants: the ledger metrics take steps of whole days (their sums are daily) and their
points are exact sums of integer columns; every series has a point for every bucket (0
for the ledger metrics, None for a wait without admissions); at most MAX_BUCKETS
buckets; members and viewers see their own team only (another team is not found),
admins every team; bad input is a BadRequest naming the field.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from aicluster.control.api_ops import BadRequest, NotFoundError
from aicluster.control.usage import parse_since
from aicluster.store.identity import Principal
from aicluster.store.usage_series import UsageSeriesStore

DAY = 86400
MAX_BUCKETS = 1000
METRICS = {
    "gpu_hours": "GPU-hours",
    "cost_usd": "USD",
    "queue_wait_s": "seconds",
}
DAILY = ("gpu_hours", "cost_usd")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": DAY, "w": 7 * DAY}
_STEP = re.compile(r"(\d{1,6})([smhdw])")


def parse_step(text: str) -> int:
    """`1d`, `6h`, `1w`, ... in seconds (at least a minute)."""
    m = _STEP.fullmatch(text.strip())
    if not m:
        raise BadRequest(f"step: {text[:20]!r} is not a duration (1d, 6h, 1w)", field="step")
    seconds = int(m.group(1)) * _UNITS[m.group(2)]
    if seconds < 60:
        raise BadRequest("step: at least a minute", field="step")
    return seconds


@dataclass
class UsageSeriesOps:
    series_store: UsageSeriesStore
    team_exists: Callable[[str], bool]

    def _scope(self, who: Principal, team: str | None) -> str | None:
        if not who.is_admin:
            if team not in (None, who.team) or not who.team:
                raise NotFoundError(f"team {team!r} not found")
            return who.team
        if team is not None and not self.team_exists(team):
            raise NotFoundError(f"team {team!r} not found")
        return team

    def series(self, who: Principal, since: str, step: str, metric: str, team: str | None):
        if metric not in METRICS:
            raise BadRequest(f"metric must be one of {', '.join(METRICS)}", field="metric")
        step_s = parse_step(step)
        if metric in DAILY and step_s % DAY:
            raise BadRequest(f"step: {metric} takes whole days (1d, 7d)", field="step")
        now = self.series_store.clock()
        start = parse_since(since, now)
        if start > now:
            raise BadRequest("since: a time in the past", field="since")
        first = math.floor(start / step_s) * step_s
        n = math.floor((now - first) / step_s) + 1
        if n > MAX_BUCKETS:
            raise BadRequest(
                f"step: {n} buckets from since to now; at most {MAX_BUCKETS}", field="step"
            )
        team = self._scope(who, team)
        buckets = [first + i * step_s for i in range(n)]
        if metric in DAILY:
            series = self._daily(metric, first, step_s, n, team, now)
        else:
            series = self._waits(first, step_s, n, team)
        return {
            "metric": metric,
            "unit": METRICS[metric],
            "since": first,
            "until": now,
            "step_s": step_s,
            "team": team,
            "buckets": buckets,
            "series": series,
        }

    def _daily(self, metric, first, step_s, n, team, now) -> list[dict]:
        rows = self.series_store.team_days(first // DAY, math.floor(now / DAY), team)
        acc: dict[str, list[int]] = {}
        for r in rows:
            i = (r.day * DAY - first) // step_s
            if 0 <= i < n:
                values = acc.setdefault(r.team, [0] * n)
                values[i] += r.gpu_ms if metric == "gpu_hours" else r.cost_micros
        scale = 3.6e6 if metric == "gpu_hours" else 1e6  # GPU-ms per hour; micros per unit
        out = []
        for name in sorted(acc):
            values = acc[name]
            out.append(
                {
                    "team": name,
                    "points": [[first + i * step_s, v / scale] for i, v in enumerate(values)],
                    "total": sum(values) / scale,
                }
            )
        return out

    def _waits(self, first, step_s, n, team) -> list[dict]:
        acc: dict[str, list[list[float]]] = {}
        for a in self.series_store.admissions(first, None, team):
            i = int((a.ts - first) // step_s)
            if 0 <= i < n:
                acc.setdefault(a.team, [[] for _ in range(n)])[i].append(a.wait_s)
        out = []
        for name in sorted(acc):
            per = acc[name]
            every = [w for ws in per for w in ws]
            t = [first + i * step_s for i in range(n)]
            out.append(
                {
                    "team": name,
                    "points": [
                        [t[i], sum(ws) / len(ws) if ws else None] for i, ws in enumerate(per)
                    ],
                    "max": [[t[i], max(ws) if ws else None] for i, ws in enumerate(per)],
                    "admissions": [[t[i], len(ws)] for i, ws in enumerate(per)],
                    "total": sum(every) / len(every),
                    "max_s": max(every),
                    "count": len(every),
                }
            )
        return out
