"""What gateway processes get from the control plane, and what they send back.

A gateway process (gateway.process) serves the OpenAI and Ollama routes without the state
store. It follows the *feed*: named sections, each with a content hash:
- `services`: the endpoint table (READY replicas with their URL and secret, routing
  policy and options, the model name each engine serves);
- `tokens`: people's tokens as digests with their user, team, role, expiry and
  revocation (store.gateway_reports.gateway_tokens); never a token itself;
- `limits`: the rate limits (store.rate_limits).

Invariants:
- A section's hash is the hash of its content, so it means the same on every
  control-plane replica: a gateway that reconnects to another replica resumes with the
  hashes it has, and gets only the sections whose content differs (`changes`).
- Sections are rebuilt from memory (the endpoint table) and the store at most every
  `REFRESH_S`, by one caller at a time, whatever the number of gateways waiting.
- A gateway keeps serving the last sections it got while no control plane answers.
- Demand flows back in reports (store.gateway_reports); the leader's autoscaler sees its
  own process's table plus every other fresh report (`merge_demand`).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from aicluster.control.endpoints import Demand, EndpointTable, ServiceEndpoints
from aicluster.store.gateway_reports import GatewayReports, ServiceDemand, gateway_tokens

SECTIONS = ("services", "tokens", "limits")
REFRESH_S = 0.25
MAX_WAIT_S = 30.0

Name = Annotated[str, Field(min_length=1, max_length=128)]


class DemandIn(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    team: Annotated[str, Field(min_length=1, max_length=64)]
    name: Name
    ongoing: Annotated[int, Field(ge=0, le=10**9)] = 0
    held: Annotated[int, Field(ge=0, le=10**9)] = 0
    waiting_s: Annotated[float | None, Field(ge=0, le=10**9)] = None
    idle_s: Annotated[float | None, Field(ge=0, le=10**12)] = None


class GatewayReport(BaseModel):
    """A gateway's report: its id and its demand per service (POST /v1/gateway/report)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    gateway_id: Annotated[str, Field(min_length=1, max_length=80, pattern=r"^[\w.:@-]+$")]
    services: Annotated[list[DemandIn], Field(max_length=100_000)] = []


def _hash(data) -> str:
    raw = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(raw).hexdigest()[:24]


def services_doc(eps: list[ServiceEndpoints]) -> list[dict]:
    return sorted(
        (
            {
                "team": ep.team,
                "name": ep.name,
                "engine": ep.engine,
                "routing": ep.routing,
                "routing_options": dict(ep.routing_options),
                "served_model": ep.served_model,
                "replicas": [
                    {"replica_id": r.replica_id, "url": r.url, "secret": r.secret}
                    for r in ep.replicas
                ],
            }
            for ep in eps
        ),
        key=lambda d: (d["team"], d["name"]),
    )


def limits_doc(limits) -> list[dict]:
    keep = ("scope", "subject", "requests_per_s", "burst", "tokens_per_min", "updated_at")
    return sorted(
        ({k: getattr(lim, k) for k in keep} for lim in limits),
        key=lambda d: (d["scope"], d["subject"]),
    )


class GatewayFeed:
    """The sections of the feed, rebuilt at most every REFRESH_S (thread-safe)."""

    def __init__(
        self,
        table: EndpointTable,
        tokens: Callable[[], list],
        limits: Callable[[], list],
        clock=time.monotonic,
    ):
        self.table, self._tokens, self._limits, self.clock = table, tokens, limits, clock
        self._lock = threading.Lock()
        self._built_at = -1e18
        self._sections: dict[str, tuple[str, object]] = {}

    @classmethod
    def of(cls, table: EndpointTable, store, rate_limits) -> GatewayFeed:
        return cls(table, lambda: gateway_tokens(store), lambda: limits_doc(rate_limits.all()))

    def sections(self) -> dict[str, tuple[str, object]]:
        """{name: (hash, data)}, at most REFRESH_S old."""
        with self._lock:
            if self.clock() - self._built_at >= REFRESH_S:
                data = {
                    "services": services_doc(self.table.all()),
                    "tokens": self._tokens(),
                    "limits": self._limits(),
                }
                self._sections = {k: (_hash(v), v) for k, v in data.items()}
                self._built_at = self.clock()
            return dict(self._sections)

    def changes(self, known: dict[str, str]) -> dict:
        """The sections whose hash differs from `known`'s, and every current hash."""
        current = self.sections()
        return {
            "hashes": {k: h for k, (h, _) in current.items()},
            "sections": {k: d for k, (h, d) in current.items() if known.get(k) != h},
        }


def merge_demand(local: Demand, remote: list[ServiceDemand], now: float) -> Demand:
    """This process's demand for one service plus other gateways' fresh reports of it."""
    out = Demand(local.ongoing, local.last_request_at, local.waiting_since, local.held)
    for d in remote:
        out.ongoing += d.ongoing
        out.held += d.held
        if d.waiting_s is not None:
            since = now - d.waiting_s
            out.waiting_since = (
                since if out.waiting_since is None else min(out.waiting_since, since)
            )
        if d.idle_s is not None:
            out.last_request_at = max(out.last_request_at, now - d.idle_s)
    return out


def report_of(table: EndpointTable, now: float) -> list[ServiceDemand]:
    """This process's demand per service, as a report carries it."""
    out = []
    for ep in table.all():
        d = table.demand(ep.team, ep.name)
        if not (d.ongoing or d.held or d.last_request_at):
            continue
        out.append(
            ServiceDemand(
                ep.team,
                ep.name,
                d.ongoing,
                d.held,
                None if d.waiting_since is None else max(0.0, now - d.waiting_since),
                None if not d.last_request_at else max(0.0, now - d.last_request_at),
            )
        )
    return out


class RemoteDemand:
    """Other gateways' demand per service, read once per reconcile (the leader's)."""

    def __init__(self, reports: GatewayReports, own_id: str):
        self.reports, self.own_id = reports, own_id

    def read(self) -> dict[tuple[str, str], list[ServiceDemand]]:
        out: dict[tuple[str, str], list[ServiceDemand]] = {}
        for _age, d in self.reports.fresh(exclude=self.own_id):
            out.setdefault((d.team, d.name), []).append(d)
        return out

    def merged(self, table: EndpointTable, max_age_s: float = 1.0, clock=time.time):
        """`(team, name) -> Demand`: this process's demand plus the other gateways' fresh
        reports, the reports read at most once per `max_age_s` (what describe shows, on
        any control-plane replica, leader or not)."""
        cache: dict = {"at": None, "remote": {}}

        def demand(team: str, name: str) -> Demand:
            now = clock()
            if cache["at"] is None or now - cache["at"] > max_age_s:
                cache["remote"], cache["at"] = self.read(), now
            remote = cache["remote"].get((team, name))
            local = table.demand(team, name)
            return merge_demand(local, remote, now) if remote else local

        return demand
