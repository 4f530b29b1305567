"""Engine load, scraped from each READY replica's Prometheus `/metrics`, for routing.

Vocabulary:
- report: what one scrape of a replica read: requests running and waiting (vLLM's
  `vllm:num_requests_running`, `vllm:num_requests_waiting`; TGI's `tgi_batch_current_size`,
  `tgi_queue_size`), KV cache usage 0-1 (`vllm:kv_cache_usage_perc`, or the older
  `vllm:gpu_cache_usage_perc`), and `own`: this gateway's outstanding requests on the
  replica while the scrape was in flight (the larger of the counts before and after).
- others: running + waiting - own, at least 0: load other clients (other gateways) put on
  the replica, taken as steady until the next report. `core.routing` adds it to the
  gateway's live outstanding count (`ReplicaState.reported_load`, `own_at_report`).

Invariants:
- Scraping never delays a request: one background task per gateway and event loop,
  started by the first `states` call, one GET per READY replica per `interval_s`, each
  bounded by a timeout; a replica that does not answer with metrics is not reported.
- A report older than `STALE_INTERVALS` intervals is ignored: that replica's load is the
  gateway's own count alone, as it is before the first scrape.
- Reports of replicas that left the endpoint table are dropped at the next round.
- Engines without Prometheus metrics (`NO_METRICS`) are never scraped.
- Each scrape also hands the engine's own series of `ENGINE_SERIES` (summed over label
  sets) to the endpoint table, for `describe` and the platform's /metrics (control.metrics).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from aicluster.control.endpoints import EndpointTable, ServiceEndpoints
from aicluster.core.routing import ReplicaState
from aicluster.runtime.replica_auth import SECRET_HEADER

log = logging.getLogger(__name__)
NO_METRICS = frozenset({"ollama"})
STALE_INTERVALS = 3.0
MAX_METRICS_BYTES = 4 << 20
RUNNING = ("vllm:num_requests_running", "tgi_batch_current_size")
WAITING = ("vllm:num_requests_waiting", "tgi_queue_size")
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
# The engine's series shown per replica: its name -> the short name the platform uses.
ENGINE_SERIES = {
    "vllm:num_requests_running": "requests_running",
    "vllm:num_requests_waiting": "requests_waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:prefix_cache_queries_total": "prefix_cache_queries",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
    "tgi_batch_current_size": "requests_running",
    "tgi_queue_size": "requests_waiting",
}


@dataclass(frozen=True)
class Report:
    running: float
    waiting: float
    kv_cache_usage: float
    own: int
    at: float  # time.monotonic() when the answer arrived


def parse_metrics(text: str) -> tuple[float, float, float] | None:
    """(running, waiting, KV cache usage) from Prometheus text, summed over label sets
    (usage: the largest); None when the text has neither request gauge."""
    running = waiting = usage = 0.0
    seen = False
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name, value = _sample(line)
        if name is None:
            continue
        if name in RUNNING:
            running, seen = running + value, True
        elif name in WAITING:
            waiting, seen = waiting + value, True
        elif name in KV_USAGE:
            usage = max(usage, value)
    return (running, waiting, usage) if seen else None


def engine_series(text: str) -> dict[str, float]:
    """The ENGINE_SERIES found in Prometheus text, by short name, summed over label sets."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        name = line[:brace] if brace >= 0 else line.partition(" ")[0]
        short = ENGINE_SERIES.get(name)
        if short is None:
            continue
        try:
            value = float(line[line.rfind("}") + 1 :].split()[0] if brace >= 0 else line.split()[1])
        except (IndexError, ValueError):
            continue
        if value == value and value >= 0:
            out[short] = out.get(short, 0.0) + value
    return out


def _sample(line: str) -> tuple[str | None, float]:
    brace = line.find("{")
    if brace >= 0:
        name, rest = line[:brace], line[line.rfind("}") + 1 :]
    else:
        name, _, rest = line.partition(" ")
    if name not in RUNNING and name not in WAITING and name not in KV_USAGE:
        return None, 0.0
    try:
        value = float(rest.split()[0])
    except (IndexError, ValueError):
        return None, 0.0
    return (name, value) if value == value and value >= 0 else (None, 0.0)  # no NaN


class LoadScraper:
    def __init__(
        self,
        table: EndpointTable,
        client: Callable[[], httpx.AsyncClient],
        own: Callable[[str, str, str], int],
        interval_s: float | None = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.table, self._client, self._own, self.clock = table, client, own, clock
        self.interval_s = interval_s  # None: never scrape
        self.reports: dict[str, Report] = {}
        self._task: asyncio.Task | None = None

    def states(self, ep: ServiceEndpoints) -> list[ReplicaState]:
        """The service's replicas as routing sees them, with their fresh reports."""
        self._ensure_running()
        now = self.clock()
        out = []
        for r in ep.replicas:
            rep = self.reports.get(r.replica_id)
            if rep is None or now - rep.at > STALE_INTERVALS * (self.interval_s or 0):
                out.append(ReplicaState(r.replica_id))
            else:
                out.append(
                    ReplicaState(
                        r.replica_id,
                        reported_load=round(rep.running + rep.waiting),
                        own_at_report=rep.own,
                        kv_cache_usage=rep.kv_cache_usage,
                    )
                )
        return out

    def _ensure_running(self) -> None:
        if self.interval_s is None or (self._task is not None and not self._task.done()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._task = loop.create_task(self._run(), name="aicluster-load-scraper")

    async def _run(self) -> None:
        assert self.interval_s is not None
        while True:
            started = self.clock()
            try:
                await self.scrape_once()
            except Exception:  # a bad round must not end the scraping
                log.exception("scraping replicas' load failed; trying again next round")
            await asyncio.sleep(max(0.05, self.interval_s - (self.clock() - started)))

    async def scrape_once(self) -> None:
        """One round: every READY replica of every service with metrics, at once."""
        targets = [
            (ep, r) for ep in self.table.all() if ep.engine not in NO_METRICS for r in ep.replicas
        ]
        live = {r.replica_id for _, r in targets}
        for rid in set(self.reports) - live:
            self.reports.pop(rid, None)
        self.table.keep_engine_metrics(live)
        await asyncio.gather(*(self._scrape(ep, r) for ep, r in targets))

    async def _scrape(self, ep: ServiceEndpoints, r) -> None:
        timeout = min(2.0, max(0.2, (self.interval_s or 1.0) * 0.8))
        own_before = self._own(ep.team, ep.name, r.replica_id)
        try:
            resp = await self._client().get(
                f"{r.url}/metrics", headers={SECRET_HEADER: r.secret}, timeout=timeout
            )
        except httpx.HTTPError:
            return
        if resp.status_code != 200 or len(resp.content) > MAX_METRICS_BYTES:
            return
        parsed = parse_metrics(resp.text)
        if parsed is None:
            return
        self.table.set_engine_metrics(r.replica_id, engine_series(resp.text))
        running, waiting, usage = parsed
        # The engine counted somewhere between the two reads: take the larger, so requests of
        # ours that finished meanwhile are never taken for someone else's (a phantom load
        # that would last a whole interval); others' load is at worst underestimated.
        own = max(own_before, self._own(ep.team, ep.name, r.replica_id))
        self.reports[r.replica_id] = Report(running, waiting, usage, own, self.clock())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RuntimeError):
                await task
