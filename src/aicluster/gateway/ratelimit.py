"""The gateway's rate limiter: token buckets per team and per API token.

Vocabulary: a *bucket* holds up to `capacity` units and refills at `rate` units a second.
A *requests bucket* (capacity: the limit's burst, or its rate rounded up when no burst is
set; rate: requests per second) gives one unit per request. A *tokens bucket* (capacity:
tokens per minute; rate: that over 60 s) is charged what a request used, prompt +
completion tokens, after it completes (not reserved up front: `max_tokens` is often unset
and far above what is used); it may go below zero, and while it is below zero the team's
(token's) requests are refused. *Retry-After* is the whole seconds, at least 1,
until the refusing bucket has what the request needs.

Invariants:
- No store read per request: the limits (store.rate_limits) are held in memory and
  replaced by `refresh` about once a second (a background thread); a request reads them
  and its buckets only. A limit that changes gets fresh, full buckets.
- A request is admitted only when every bucket that applies to it (its team's and its
  token's) can give it a unit; then all of them do, none otherwise.
- Every gateway enforces its own buckets: with several control-plane replicas (each runs
  a gateway), or several gateway processes, a team may get up to N times its limit across
  N gateways. The limits are per gateway; a shared budget would need a shared counter.
- Buckets are touched from the event loop only; `refresh` swaps the limit table whole.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from aicluster.store.rate_limits import RateLimit

log = logging.getLogger(__name__)


@dataclass
class Bucket:
    rate: float  # units per second
    capacity: float
    level: float
    at: float  # when `level` was last brought up to date

    @classmethod
    def full(cls, rate: float, capacity: float, now: float) -> Bucket:
        return cls(rate, capacity, capacity, now)

    def refill(self, now: float) -> None:
        if now > self.at:
            self.level = min(self.capacity, self.level + (now - self.at) * self.rate)
        self.at = max(self.at, now)

    def wait_s(self, now: float, need: float) -> float:
        """Seconds until the bucket holds `need` (0: it does now)."""
        self.refill(now)
        if self.level >= need:
            return 0.0
        return math.inf if self.rate <= 0 else (need - self.level) / self.rate

    def take(self, amount: float) -> None:
        self.level -= amount


@dataclass(frozen=True)
class Refused:
    """Why a request is over a limit: `kind` requests | tokens (OpenAI's error type),
    `message` naming the team or token and the limit, `retry_after_s` whole seconds."""

    kind: str
    message: str
    retry_after_s: int


def _retry_after(wait: float) -> int:
    return 3600 if math.isinf(wait) else max(1, math.ceil(wait))


class Limiter:
    """`load`: the limits now (store.rate_limits.RateLimitStore.all), called by `refresh`."""

    def __init__(self, load: Callable[[], list[RateLimit]] | None = None, clock=time.monotonic):
        self.load, self.clock = load, clock
        self._limits: dict[tuple[str, str], RateLimit] = {}
        self._buckets: dict[tuple[str, str, str], tuple[RateLimit, Bucket]] = {}

    def refresh(self) -> None:
        if self.load is not None:
            self.set_limits(self.load())

    def set_limits(self, limits: list[RateLimit]) -> None:
        self._limits = {(x.scope, x.subject): x for x in limits}

    def _subjects(self, who) -> list[tuple[str, str]]:
        out = []
        if who.team:
            out.append(("team", who.team))
        if getattr(who, "token_id", None) is not None:
            out.append(("token", str(who.token_id)))
        return out

    def _bucket(self, scope: str, subject: str, kind: str, now: float) -> Bucket | None:
        limit = self._limits.get((scope, subject))
        if limit is None:
            self._buckets.pop((scope, subject, kind), None)
            return None
        if kind == "requests":
            if limit.requests_per_s is None:
                return None
            rate = limit.requests_per_s
            capacity = limit.burst if limit.burst is not None else max(1, math.ceil(rate))
        else:
            if limit.tokens_per_min is None:
                return None
            rate, capacity = limit.tokens_per_min / 60.0, float(limit.tokens_per_min)
        key = (scope, subject, kind)
        held = self._buckets.get(key)
        if held is None or held[0] != limit:
            held = (limit, Bucket.full(rate, capacity, now))
            self._buckets[key] = held
        return held[1]

    def admit(self, who) -> Refused | None:
        """Take one request from every requests bucket of `who`, or say which limit it is
        over (taking nothing)."""
        now = self.clock()
        taking = []
        for scope, subject in self._subjects(who):
            tokens = self._bucket(scope, subject, "tokens", now)
            if tokens is not None:
                wait = tokens.wait_s(now, 0.0)
                if wait > 0:
                    tpm = self._limits[(scope, subject)].tokens_per_min
                    return Refused(
                        "tokens",
                        f"{scope} {subject} over {tpm} tokens/min: "
                        f"retry after {_retry_after(wait)} s",
                        _retry_after(wait),
                    )
            reqs = self._bucket(scope, subject, "requests", now)
            if reqs is not None:
                wait = reqs.wait_s(now, 1.0)
                if wait > 0:
                    limit = self._limits[(scope, subject)]
                    return Refused(
                        "requests",
                        f"{scope} {subject} over {limit.requests_per_s:g} requests/s "
                        f"(burst {int(reqs.capacity)}): retry after {_retry_after(wait)} s",
                        _retry_after(wait),
                    )
                taking.append(reqs)
        for b in taking:
            b.take(1.0)
        return None

    def charge(self, who, tokens: int) -> None:
        """Charge the tokens a completed request used to `who`'s tokens buckets."""
        if tokens <= 0:
            return
        now = self.clock()
        for scope, subject in self._subjects(who):
            b = self._bucket(scope, subject, "tokens", now)
            if b is not None:
                b.refill(now)
                b.take(float(tokens))


__all__ = ["Bucket", "Limiter", "Refused"]
