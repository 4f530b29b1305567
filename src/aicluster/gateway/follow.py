"""A gateway process's link to the control plane: it follows the feed and reports back.

- `Upstreams`: the control-plane replicas this gateway may talk to (their URLs) and the
  admin token it authenticates with. A call goes to the replica that last answered; on a
  connection error or a 5xx the next one is tried, each once.
- `FeedFollower`: a thread that long-polls `GET /v1/gateway/feed` with the hashes of
  what it holds and applies each section that changed: the endpoint table
  (control.endpoints), the token book (gateway.tokens), the rate limits
  (gateway.ratelimit).
- `Reporter`: a thread that, about once a second, POSTs this gateway's demand per
  service (`/v1/gateway/report`) and flushes its usage batches (`/v1/gateway/usage`,
  through gateway.usage.UsageRecorder, which keeps a batch until it is acknowledged).

Invariants:
- While no control plane answers, the gateway keeps serving with the last sections it
  got (`synced` stays true once it has been) and retries with a backoff of at most
  `MAX_BACKOFF_S`; it resumes with its hashes, so only what changed is sent again.
- Nothing here runs on a request's path: requests read the table, book and limiter
  in memory.
"""

from __future__ import annotations

import logging
import threading
import time

import httpx

from aicluster.control.endpoints import Endpoint, EndpointTable, ServiceEndpoints
from aicluster.control.gateway_feed import SECTIONS, report_of
from aicluster.gateway.ratelimit import Limiter
from aicluster.gateway.tokens import TokenBook
from aicluster.store.rate_limits import RateLimit

log = logging.getLogger(__name__)
FEED_WAIT_S = 20.0
MAX_BACKOFF_S = 2.0
REPORT_EVERY_S = 1.0


class UpstreamError(Exception):
    pass


class Upstreams:
    def __init__(self, urls: list[str], token: str, timeout_s: float = 10.0):
        if not urls:
            raise ValueError("at least one control-plane URL is needed")
        self.urls = [u.rstrip("/") for u in urls]
        self.headers = {"Authorization": f"Bearer {token}"}
        self.timeout_s = timeout_s
        self._at = 0
        self._lock = threading.Lock()

    def call(self, client: httpx.Client, method: str, path: str, **kw) -> httpx.Response:
        """The first answer below 500 from the replicas, starting at the last that
        answered; UpstreamError when none does."""
        with self._lock:
            start = self._at
        errors = []
        for i in range(len(self.urls)):
            at = (start + i) % len(self.urls)
            url = self.urls[at]
            try:
                r = client.request(method, url + path, headers=self.headers, **kw)
            except httpx.HTTPError as exc:
                errors.append(f"{url}: {type(exc).__name__}")
                continue
            if r.status_code >= 500:
                errors.append(f"{url}: {r.status_code}")
                continue
            with self._lock:
                self._at = at
            if r.status_code in (401, 403):
                raise UpstreamError(f"{url} refused the gateway's token ({r.status_code})")
            return r
        raise UpstreamError("; ".join(errors))


def endpoints_of(doc: list[dict]) -> dict[tuple[str, str], ServiceEndpoints]:
    return {
        (d["team"], d["name"]): ServiceEndpoints(
            team=d["team"],
            name=d["name"],
            engine=d["engine"],
            routing=d["routing"],
            routing_options=dict(d["routing_options"]),
            replicas=tuple(Endpoint(r["replica_id"], r["url"], r["secret"]) for r in d["replicas"]),
            served_model=d["served_model"],
        )
        for d in doc
    }


class FeedFollower:
    def __init__(
        self,
        upstreams: Upstreams,
        table: EndpointTable,
        book: TokenBook,
        limiter: Limiter,
        wait_s: float = FEED_WAIT_S,
    ):
        self.upstreams, self.table, self.book, self.limiter = upstreams, table, book, limiter
        self.wait_s = wait_s
        self.hashes: dict[str, str] = {}
        self.synced = threading.Event()  # every section received once
        self.last_sync_at: float | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def apply(self, answer: dict) -> list[str]:
        """Apply the sections of one feed answer; the names applied."""
        sections = answer.get("sections", {})
        if "services" in sections:
            self.table.publish(endpoints_of(sections["services"]))
        if "tokens" in sections:
            self.book.set(sections["tokens"])
        if "limits" in sections:
            self.limiter.set_limits([RateLimit(**d, actor=None) for d in sections["limits"]])
        for name in sections:
            if name in SECTIONS:
                self.hashes[name] = answer["hashes"][name]
        if all(name in self.hashes for name in SECTIONS):
            self.synced.set()
        self.last_sync_at = time.time()
        return list(sections)

    def poll(self, client: httpx.Client, wait_s: float) -> list[str]:
        params = {**self.hashes, "wait": wait_s}
        r = self.upstreams.call(client, "GET", "/v1/gateway/feed", params=params)
        if r.status_code != 200:
            raise UpstreamError(f"feed answered {r.status_code}: {r.text[:200]}")
        return self.apply(r.json())

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gateway-feed", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()

    def _run(self) -> None:
        backoff = 0.1
        timeout = httpx.Timeout(connect=2.0, read=self.wait_s + 10.0, write=10.0, pool=10.0)
        with httpx.Client(timeout=timeout) as client:
            while not self._stopping.is_set():
                try:
                    self.poll(client, self.wait_s if self.synced.is_set() else 0.0)
                    backoff = 0.1
                except (UpstreamError, httpx.HTTPError, ValueError, KeyError) as exc:
                    log.warning("gateway feed: %s (serving the last table)", exc)
                    self._stopping.wait(backoff)
                    backoff = min(MAX_BACKOFF_S, backoff * 2)


class Reporter:
    def __init__(self, upstreams: Upstreams, gateway_id: str, table: EndpointTable, usage=None):
        self.upstreams, self.gateway_id, self.table, self.usage = (
            upstreams,
            gateway_id,
            table,
            usage,
        )
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._client = httpx.Client(timeout=httpx.Timeout(5.0, connect=2.0))

    def send_usage(self, batch: dict) -> None:
        """The usage recorder's sink: returns once the control plane took the batch."""
        r = self.upstreams.call(self._client, "POST", "/v1/gateway/usage", json=batch)
        if r.status_code != 200:
            raise UpstreamError(f"usage batch answered {r.status_code}: {r.text[:200]}")

    def report(self) -> None:
        services = [d.__dict__ for d in report_of(self.table, time.time())]
        body = {"gateway_id": self.gateway_id, "services": services}
        r = self.upstreams.call(self._client, "POST", "/v1/gateway/report", json=body)
        if r.status_code != 200:
            raise UpstreamError(f"report answered {r.status_code}: {r.text[:200]}")

    def step(self) -> None:
        try:
            self.report()
        except (UpstreamError, httpx.HTTPError) as exc:
            log.warning("gateway report not delivered: %s", exc)
        if self.usage is not None:
            self.usage.flush()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gateway-report", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.wait(REPORT_EVERY_S):
            self.step()

    def stop(self, timeout: float = 5.0) -> None:
        """The last report and usage flush, then the thread ends."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.step()
        self._client.close()
