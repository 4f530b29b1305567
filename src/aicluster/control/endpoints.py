"""The endpoint table: READY replicas per service, pushed to the gateway.

The service loop publishes the whole table when a replica becomes ready or goes
away; the gateway reads it per request without touching the store. The gateway
reports back, through the same object, how many requests each service has in
flight and when a request last arrived (for autoscaling and scale-from-zero).
Thread-safe: the loop and the gateway live on different threads.

Each endpoint carries its replica's secret (runtime.replica_auth), which the gateway
sends on every proxied request. Secrets live only here and in the replica's
environment: never in the store, API answers, events or logs (`repr` omits them).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
from dataclasses import dataclass, field
from pathlib import Path

KEY_FILE = "replica.key"


@dataclass(frozen=True)
class Endpoint:
    replica_id: str
    url: str
    secret: str = field(default="", repr=False)


class ReplicaSecrets:
    """secret(replica) = HMAC-SHA256(key, replica id): unguessable without the key, and
    the same after a control-plane restart, so adopted replicas keep answering. The key is
    32 random bytes in HOME/replica.key (mode 0600), made at the first start; without a
    home (tests), a key in memory."""

    def __init__(self, home: Path | None = None) -> None:
        self._key = _load_key(Path(home) / KEY_FILE) if home else secrets.token_bytes(32)

    def secret(self, replica_id: str) -> str:
        return hmac.new(self._key, replica_id.encode(), hashlib.sha256).hexdigest()


def _load_key(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        key = path.read_bytes()
        if len(key) >= 32:
            return key
        raise RuntimeError(
            f"{path}: too short; delete it and restart (replicas restart too)"
        ) from None
    key = secrets.token_bytes(32)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    return key


@dataclass(frozen=True)
class ServiceEndpoints:
    team: str
    name: str
    engine: str
    routing: str
    routing_options: dict = field(default_factory=dict)
    replicas: tuple[Endpoint, ...] = ()
    served_model: str = ""  # the model name the engine answers to ("": the service's name)


@dataclass
class Demand:
    ongoing: int = 0
    last_request_at: float = 0.0
    waiting_since: float | None = None  # a request is held for a service with no replica
    held: int = 0  # requests held now; waiting_since clears when the last one leaves


class EndpointTable:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._services: dict[tuple[str, str], ServiceEndpoints] = {}
        self._demand: dict[tuple[str, str], Demand] = {}
        self._engine: dict[str, dict[str, float]] = {}  # replica id -> its engine's series
        self.version = 0

    def publish(self, services: dict[tuple[str, str], ServiceEndpoints]) -> bool:
        with self._lock:
            if services == self._services:
                return False
            self._services = dict(services)
            self.version += 1
            return True

    def announce(self, ep: ServiceEndpoints) -> None:
        """A service just deployed, before the loop's next publish: requests for it are
        held (not refused as unknown) until it has a replica."""
        with self._lock:
            if (ep.team, ep.name) not in self._services:
                self._services = {**self._services, (ep.team, ep.name): ep}
                self.version += 1

    def get(self, team: str, name: str) -> ServiceEndpoints | None:
        with self._lock:
            return self._services.get((team, name))

    def all(self) -> list[ServiceEndpoints]:
        with self._lock:
            return list(self._services.values())

    # -- engine metrics, written by the gateway's load scraper (gateway.load) -------

    def set_engine_metrics(self, replica_id: str, series: dict[str, float]) -> None:
        with self._lock:
            self._engine[replica_id] = dict(series)

    def keep_engine_metrics(self, replica_ids: set[str]) -> None:
        """Forget the engine metrics of replicas that left the table."""
        with self._lock:
            self._engine = {k: v for k, v in self._engine.items() if k in replica_ids}

    def engine_metrics(self, replica_id: str | None = None) -> dict:
        """One replica's last scraped engine series ({} when none), or all of them."""
        with self._lock:
            if replica_id is None:
                return {k: dict(v) for k, v in self._engine.items()}
            return dict(self._engine.get(replica_id, {}))

    # -- demand, written by the gateway ---------------------------------------------

    def request_started(self, team: str, name: str, now: float, held: bool = False) -> None:
        with self._lock:
            d = self._demand.setdefault((team, name), Demand())
            d.ongoing += 1
            d.last_request_at = now
            if held:
                d.held += 1
                if d.waiting_since is None:
                    d.waiting_since = now

    def request_finished(self, team: str, name: str) -> None:
        with self._lock:
            d = self._demand.setdefault((team, name), Demand())
            d.ongoing = max(0, d.ongoing - 1)

    def unheld(self, team: str, name: str) -> None:
        """One held request stopped waiting (a replica came, it gave up, or it left)."""
        with self._lock:
            d = self._demand.setdefault((team, name), Demand())
            d.held = max(0, d.held - 1)
            if d.held == 0:
                d.waiting_since = None

    def demand(self, team: str, name: str) -> Demand:
        with self._lock:
            d = self._demand.get((team, name), Demand())
            return Demand(d.ongoing, d.last_request_at, d.waiting_since, d.held)
