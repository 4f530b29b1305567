"""Routing policies: which replicas of a service may serve a request, best first.

Vocabulary:
- ReplicaState: one replica as the gateway's endpoint table sees it: its id, whether its
  health probe passes, and the load it last reported itself (`reported_load`: running +
  waiting requests, scraped from its metrics; `own_at_report`: this gateway's outstanding
  count on it while that scrape was in flight; `kv_cache_usage`, 0-1). No report: all zero.
- outstanding: requests this gateway sent to a replica and not yet finished, counted by the
  policy from `on_start` / `on_finish`.
- others: max(0, reported_load - own_at_report): load other clients (other gateways) put
  on the replica, as of its last report.
- load: outstanding + others. The gateway's own requests are counted live, the rest as
  last reported, so no request counts twice and several gateways see one another's load.
- backed off: a replica whose last attempt failed (`on_result(ok=False)`); it is skipped
  until `now >= retry_at`, the delay doubling with each consecutive failure up to a cap.
  After the delay it is *probing*: it is eligible again but takes one request at a time
  until a success clears its record (a half-open circuit breaker).
- eligible: healthy, not backed off, not a probing replica that is already busy.
- candidates: what `choose_replicas` returns — eligible replica ids in preference order; the
  gateway sends the request to the first and retries on the next ones.

Invariants:
- `choose_replicas` returns every eligible replica exactly once and nothing else; the list
  is empty exactly when no replica is eligible.
- Deterministic: the same sequence of calls gives the same answers (power_of_two draws
  from a seeded or injected RNG; hashes are blake2b, not Python's salted `hash`).
- Pure: no I/O, threads or clock reads; time arrives as `RouteRequest.now` and the `now`
  of `on_result`.

Ideas, not code, from: Ray Serve's replica scheduler (power of two choices, backoff of
failed replicas); Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with Bounded
Loads" (2018); SGLang's cache-aware router (approximate radix tree per worker, fallback to
shortest queue when workers are imbalanced).
"""

from __future__ import annotations

import bisect
import hashlib
import math
import random
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field


def stable_hash(prev: int, text: str) -> int:
    """A 64-bit hash of (prev, text), the same in every process."""
    h = hashlib.blake2b(prev.to_bytes(8, "little"), digest_size=8)
    h.update(text.encode("utf-8", "surrogatepass"))
    return int.from_bytes(h.digest(), "little")


def block_hashes(units: Sequence[str], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of `units`: entry i identifies units[:(i+1)*block_size].

    Two sequences share their first k hashes exactly when (up to hash collisions) they share
    their first k blocks, so a set of hashes is an implicit prefix tree.
    """
    out: list[int] = []
    h = 0
    for start in range(0, len(units) - block_size + 1, block_size):
        h = stable_hash(h, "\x1f".join(units[start : start + block_size]))
        out.append(h)
    return out


@dataclass(frozen=True)
class ReplicaState:
    replica_id: str
    healthy: bool = True
    reported_load: int = 0
    own_at_report: int = 0
    kv_cache_usage: float = 0.0


@dataclass(frozen=True)
class RouteRequest:
    """What a policy may look at. `headers` have lower-case names; `prompt` is the text the
    model reads (for chat, the messages' contents joined in order)."""

    now: float
    prompt: str = ""
    user: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


class PolicyOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    backoff_initial_s: float = Field(default=1.0, gt=0)
    backoff_max_s: float = Field(default=30.0, gt=0)
    hold_timeout_s: float | None = Field(
        default=None,
        gt=0,
        le=3600,
        description="how long the gateway holds a request while the service has no ready "
        "replica (scale from zero); None: the gateway's default",
    )


class PowerOfTwoOptions(PolicyOptions):
    seed: int = 0


class SessionAffinityOptions(PolicyOptions):
    header: str = Field(default="x-session-id", min_length=1)
    virtual_nodes: int = Field(default=100, ge=1, le=10_000)
    load_eps: float = Field(default=0.25, gt=0, description="bound: load < (1+eps) x mean")


class PrefixCacheOptions(PolicyOptions):
    unit: Literal["char", "word"] = "char"
    block_size: int = Field(default=64, ge=1)
    max_entries: int = Field(default=100_000, ge=1, description="(block, replica) pairs kept")
    min_match_ratio: float = Field(default=0.25, ge=0, le=1)
    balance_abs_threshold: float = Field(
        default=2.0, ge=0, description="c: a holder is overloaded when its load > rel x min + c"
    )
    balance_rel_threshold: float = Field(
        default=1.5, ge=1, description="rel (1 + r): see balance_abs_threshold"
    )


@dataclass
class _Backoff:
    failures: int
    retry_at: float


class RoutingPolicy:
    """Base class: eligibility, outstanding counts and backoff; subclasses order the pool."""

    name: ClassVar[str] = ""
    Options: ClassVar[type[PolicyOptions]] = PolicyOptions

    def __init__(self, options: PolicyOptions | None = None) -> None:
        if options is not None and not isinstance(options, self.Options):
            raise TypeError(f"{self.name} takes {self.Options.__name__}, not {type(options)}")
        self.options = options if options is not None else self.Options()
        self._outstanding: dict[str, int] = {}
        self._backoff: dict[str, _Backoff] = {}
        self._tick = 0

    # -- hooks the gateway calls ---------------------------------------------------------
    def on_start(self, replica_id: str, request: RouteRequest | None = None) -> None:
        """A request (this attempt) was sent to `replica_id`."""
        self._outstanding[replica_id] = self._outstanding.get(replica_id, 0) + 1

    def on_finish(self, replica_id: str) -> None:
        """An attempt started with `on_start` ended, whatever its outcome."""
        n = self._outstanding.get(replica_id, 0) - 1
        if n > 0:
            self._outstanding[replica_id] = n
        else:
            self._outstanding.pop(replica_id, None)

    def on_result(self, replica_id: str, ok: bool, now: float) -> None:
        """Outcome of an attempt: a failure backs the replica off, a success clears it."""
        if ok:
            self._backoff.pop(replica_id, None)
            return
        failures = self._backoff[replica_id].failures + 1 if replica_id in self._backoff else 1
        o = self.options
        delay = min(o.backoff_max_s, o.backoff_initial_s * 2 ** min(failures - 1, 60))
        self._backoff[replica_id] = _Backoff(failures, now + delay)

    def forget(self, replica_id: str) -> None:
        """The replica left the endpoint table: drop everything known about it."""
        self._outstanding.pop(replica_id, None)
        self._backoff.pop(replica_id, None)

    # -- queries -------------------------------------------------------------------------
    def outstanding(self, replica_id: str) -> int:
        return self._outstanding.get(replica_id, 0)

    def backed_off(self, replica_id: str, now: float) -> bool:
        b = self._backoff.get(replica_id)
        return b is not None and now < b.retry_at

    def load(self, replica: ReplicaState) -> int:
        others = max(0, replica.reported_load - replica.own_at_report)
        return self._outstanding.get(replica.replica_id, 0) + others

    def eligible(self, replicas: Sequence[ReplicaState], now: float) -> list[ReplicaState]:
        """Eligible replicas, sorted by id (so the answer does not depend on table order)."""
        seen: dict[str, ReplicaState] = {}
        for r in replicas:
            if not r.healthy or r.replica_id in seen:
                continue
            b = self._backoff.get(r.replica_id)
            if b is not None and (now < b.retry_at or self.outstanding(r.replica_id) >= 1):
                continue
            seen[r.replica_id] = r
        return [seen[k] for k in sorted(seen)]

    def choose_replicas(self, request: RouteRequest, replicas: Sequence[ReplicaState]) -> list[str]:
        pool = self.eligible(replicas, request.now)
        if not pool:
            return []
        self._tick += 1
        return [r.replica_id for r in self._order(request, pool)]

    # -- for subclasses ------------------------------------------------------------------
    def _order(self, request: RouteRequest, pool: list[ReplicaState]) -> list[ReplicaState]:
        raise NotImplementedError

    def _by_load(self, pool: list[ReplicaState]) -> list[ReplicaState]:
        """Least load first; ties broken by the fuller KV cache last, then by a rotation that
        moves on every call."""
        n = len(pool)
        return [
            pool[i]
            for i in sorted(
                range(n),
                key=lambda i: (
                    self.load(pool[i]),
                    round(pool[i].kv_cache_usage, 1),
                    (i - self._tick) % n,
                ),
            )
        ]


class RoundRobin(RoutingPolicy):
    name = "round_robin"

    def _order(self, request: RouteRequest, pool: list[ReplicaState]) -> list[ReplicaState]:
        start = self._tick % len(pool)
        return pool[start:] + pool[:start]


class LeastOutstanding(RoutingPolicy):
    name = "least_outstanding"

    def _order(self, request: RouteRequest, pool: list[ReplicaState]) -> list[ReplicaState]:
        return self._by_load(pool)


class PowerOfTwo(RoutingPolicy):
    """Two replicas drawn at random; the less loaded goes first, then the rest by load."""

    name = "power_of_two"
    Options = PowerOfTwoOptions
    options: PowerOfTwoOptions

    def __init__(self, options: PolicyOptions | None = None, rng: random.Random | None = None):
        super().__init__(options)
        self._rng = rng if rng is not None else random.Random(self.options.seed)

    def _order(self, request: RouteRequest, pool: list[ReplicaState]) -> list[ReplicaState]:
        if len(pool) == 1:
            return pool
        a, b = (pool[i] for i in self._rng.sample(range(len(pool)), 2))
        first = b if self.load(b) < self.load(a) else a
        return [first] + [r for r in self._by_load(pool) if r is not first]


class SessionAffinity(RoutingPolicy):
    """Consistent hashing of a session key with bounded load.

    The key is the request's `user` field, else the value of header `options.header`;
    requests without a key go by least load. Each replica owns `virtual_nodes` points on a
    64-bit ring; a key walks clockwise from its hash. A replica whose load would reach the
    bound ceil((1 + eps) x (total load + 1) / replicas) is passed over (and put last), so
    the first candidate is always under the bound; at least one replica always is.
    """

    name = "session_affinity"
    Options = SessionAffinityOptions
    options: SessionAffinityOptions

    def __init__(self, options: PolicyOptions | None = None) -> None:
        super().__init__(options)
        self._ring_ids: tuple[str, ...] = ()
        self._ring_points: list[int] = []
        self._ring_owner: list[str] = []

    def session_key(self, request: RouteRequest) -> str | None:
        return request.user or request.headers.get(self.options.header.lower()) or None

    def bound(self, pool: Sequence[ReplicaState]) -> int:
        total = sum(self.load(r) for r in pool)
        return math.ceil((1 + self.options.load_eps) * (total + 1) / len(pool))

    def ring_walk(self, key: str, pool: list[ReplicaState]) -> list[ReplicaState]:
        """The pool in the order the key's clockwise walk around the ring meets it."""
        self._build_ring(tuple(r.replica_id for r in pool))
        by_id = {r.replica_id: r for r in pool}
        start = bisect.bisect_right(self._ring_points, stable_hash(0, key))
        order: dict[str, None] = {}
        n = len(self._ring_points)
        for i in range(n):
            order.setdefault(self._ring_owner[(start + i) % n], None)
            if len(order) == len(pool):
                break
        return [by_id[k] for k in order]

    def _build_ring(self, ids: tuple[str, ...]) -> None:
        if ids == self._ring_ids:
            return
        points = sorted(
            (stable_hash(0, f"{rid}#{v}"), rid)
            for rid in ids
            for v in range(self.options.virtual_nodes)
        )
        self._ring_ids = ids
        self._ring_points = [p for p, _ in points]
        self._ring_owner = [rid for _, rid in points]

    def _order(self, request: RouteRequest, pool: list[ReplicaState]) -> list[ReplicaState]:
        key = self.session_key(request)
        if key is None:
            return self._by_load(pool)
        walk = self.ring_walk(key, pool)
        cap = self.bound(pool)
        under = [r for r in walk if self.load(r) < cap]
        return under + [r for r in walk if self.load(r) >= cap]


class PrefixIndex:
    """An approximate prefix tree: (block hash, replica) entries kept in LRU order.

    Invariants: at most `max_entries` entries; for each replica the set of its blocks is
    prefix-closed after every insert, because an insert touches a prompt's blocks deepest
    first, so an ancestor is never less recently used than its descendants and eviction
    (least recent first) removes leaves before the blocks they hang from.
    """

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._lru: OrderedDict[tuple[int, str], None] = OrderedDict()
        self._holders: dict[int, set[str]] = {}

    def __len__(self) -> int:
        return len(self._lru)

    def insert(self, hashes: Sequence[int], replica_id: str) -> None:
        for h in reversed(hashes):
            key = (h, replica_id)
            if key in self._lru:
                self._lru.move_to_end(key)
            else:
                self._lru[key] = None
                self._holders.setdefault(h, set()).add(replica_id)
        while len(self._lru) > self.max_entries:
            (h, rid), _ = self._lru.popitem(last=False)
            self._drop_holder(h, rid)

    def match(self, hashes: Sequence[int], candidates: set[str]) -> tuple[set[str], int]:
        """The candidates holding the longest prefix of `hashes`, and its length in blocks."""
        alive, depth = set(candidates), 0
        for h in hashes:
            nxt = alive & self._holders.get(h, set())
            if not nxt:
                break
            alive, depth = nxt, depth + 1
        return alive, depth

    def remove_replica(self, replica_id: str) -> None:
        for key in [k for k in self._lru if k[1] == replica_id]:
            del self._lru[key]
            self._drop_holder(key[0], replica_id)

    def _drop_holder(self, h: int, replica_id: str) -> None:
        holders = self._holders.get(h)
        if holders is not None:
            holders.discard(replica_id)
            if not holders:
                del self._holders[h]


class PrefixCache(RoutingPolicy):
    """Send a prompt where its longest prefix was sent before, unless replicas are imbalanced.

    Prompts are cut into blocks of `block_size` characters or words; the blocks of every
    prompt sent to a replica (`on_start` with the request) enter a bounded `PrefixIndex`.
    The replicas holding the longest match go first, least loaded first, unless the least
    loaded of them is overloaded: its load > balance_rel_threshold x the pool's least load
    + balance_abs_threshold (relative, so the guard acts at any scale). Then, or when the
    best match covers less than `min_match_ratio` of the prompt, the order is least load
    first, and the prompt's blocks enter the index for the replica that takes it: a hot
    prefix spreads to as many replicas as its load needs.
    """

    name = "prefix_cache"
    Options = PrefixCacheOptions
    options: PrefixCacheOptions

    def __init__(self, options: PolicyOptions | None = None) -> None:
        super().__init__(options)
        self.index = PrefixIndex(self.options.max_entries)
        self._last: tuple[str, list[int]] = ("", [])

    def hashes(self, prompt: str) -> list[int]:
        if self._last[0] != prompt or not self._last[1]:
            units: Sequence[str] = prompt if self.options.unit == "char" else prompt.split()
            self._last = (prompt, block_hashes(units, self.options.block_size))
        return self._last[1]

    def overloaded(self, load: float, least: float) -> bool:
        o = self.options
        return load > o.balance_rel_threshold * least + o.balance_abs_threshold

    def on_start(self, replica_id: str, request: RouteRequest | None = None) -> None:
        super().on_start(replica_id, request)
        if request is not None:
            self.index.insert(self.hashes(request.prompt), replica_id)

    def forget(self, replica_id: str) -> None:
        super().forget(replica_id)
        self.index.remove_replica(replica_id)

    def _order(self, request: RouteRequest, pool: list[ReplicaState]) -> list[ReplicaState]:
        by_load = self._by_load(pool)
        hashes = self.hashes(request.prompt)
        if not hashes:
            return by_load
        best, depth = self.index.match(hashes, {r.replica_id for r in pool})
        if depth == 0 or depth < self.options.min_match_ratio * len(hashes):
            return by_load
        holders = [r for r in by_load if r.replica_id in best]
        if self.overloaded(self.load(holders[0]), self.load(by_load[0])):
            return by_load
        return holders + [r for r in by_load if r.replica_id not in best]


POLICIES: Mapping[str, type[RoutingPolicy]] = MappingProxyType(
    {
        cls.name: cls
        for cls in (LeastOutstanding, RoundRobin, PowerOfTwo, SessionAffinity, PrefixCache)
    }
)
DEFAULT_POLICY = "least_outstanding"


def make_policy(
    name: str = DEFAULT_POLICY, *, rng: random.Random | None = None, **options: object
) -> RoutingPolicy:
    """A fresh policy by name; `options` are checked against its Options model (extra keys are
    an error). `rng` is used by power_of_two only (it overrides `seed`)."""
    cls = POLICIES.get(name)
    if cls is None:
        raise ValueError(f"unknown routing policy {name!r}; known: {', '.join(POLICIES)}")
    opts = cls.Options(**options)
    if cls is PowerOfTwo:
        return PowerOfTwo(opts, rng=rng)
    factory: Callable[[PolicyOptions], RoutingPolicy] = cls
    return factory(opts)
