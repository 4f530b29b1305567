"""The endpoint table: READY replicas per service, pushed to the gateway.

The service loop publishes the whole table when a replica becomes ready or goes
away; the gateway reads it per request without touching the store. The gateway
reports back, through the same object, how many requests each service has in
flight and when a request last arrived (for autoscaling and scale-from-zero).
Thread-safe: the loop and the gateway live on different threads.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Endpoint:
    replica_id: str
    url: str


@dataclass(frozen=True)
class ServiceEndpoints:
    team: str
    name: str
    engine: str
    routing: str
    routing_options: dict = field(default_factory=dict)
    replicas: tuple[Endpoint, ...] = ()


@dataclass
class Demand:
    ongoing: int = 0
    last_request_at: float = 0.0
    waiting_since: float | None = None  # a request is held for a service with no replica


class EndpointTable:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._services: dict[tuple[str, str], ServiceEndpoints] = {}
        self._demand: dict[tuple[str, str], Demand] = {}
        self.version = 0

    def publish(self, services: dict[tuple[str, str], ServiceEndpoints]) -> bool:
        with self._lock:
            if services == self._services:
                return False
            self._services = dict(services)
            self.version += 1
            return True

    def get(self, team: str, name: str) -> ServiceEndpoints | None:
        with self._lock:
            return self._services.get((team, name))

    def all(self) -> list[ServiceEndpoints]:
        with self._lock:
            return list(self._services.values())

    # -- demand, written by the gateway ---------------------------------------------

    def request_started(self, team: str, name: str, now: float, held: bool = False) -> None:
        with self._lock:
            d = self._demand.setdefault((team, name), Demand())
            d.ongoing += 1
            d.last_request_at = now
            if held and d.waiting_since is None:
                d.waiting_since = now

    def request_finished(self, team: str, name: str) -> None:
        with self._lock:
            d = self._demand.setdefault((team, name), Demand())
            d.ongoing = max(0, d.ongoing - 1)

    def unheld(self, team: str, name: str) -> None:
        with self._lock:
            self._demand.setdefault((team, name), Demand()).waiting_since = None

    def demand(self, team: str, name: str) -> Demand:
        with self._lock:
            d = self._demand.get((team, name), Demand())
            return Demand(d.ongoing, d.last_request_at, d.waiting_since)
