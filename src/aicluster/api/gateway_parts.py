"""The gateway's usage capture and rate limits, wired for a control-plane process: the
recorder (gateway.usage) with its sink (control.token_usage.TokenLedger.accept, in this
process), the limiter (gateway.ratelimit) with its source (store.rate_limits), the
thread that refreshes the one and flushes the other about once a second, and the routes
of limits, token usage and token prices. The same thread writes this process's demand
per service as a gateway report (control.gateway_feed), so that the leader's autoscaler
counts the requests every replica's gateway holds.

Invariant: `stop` flushes what was recorded last and returns before the store closes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from aicluster.api.limits_routes import limits_router
from aicluster.api.token_usage_routes import token_usage_router
from aicluster.control.limits import LimitOps
from aicluster.control.token_usage import TokenLedger, TokenUsageOps
from aicluster.gateway.ratelimit import Limiter
from aicluster.gateway.usage import SYNC_EVERY_S, UsageRecorder, sync_loop
from aicluster.store.db import Store
from aicluster.store.rate_limits import RateLimitStore
from aicluster.store.token_usage import TokenUsageStore


@dataclass
class GatewayParts:
    store: Store
    every_s: float = SYNC_EVERY_S
    report: Callable[[], object] | None = None  # this process's demand, to the store
    _stopping: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self):
        self.token_usage = TokenUsageStore(self.store)
        self.rate_limits = RateLimitStore(self.store)
        self.usage = UsageRecorder(TokenLedger(self.token_usage).accept)
        self.limiter = Limiter(self.rate_limits.all)

    def routers(self) -> list:
        s = self.store
        limit_ops = LimitOps(
            self.rate_limits,
            s.team_exists,
            token_owner=lambda i: t.user if (t := s.get_token(i)) is not None else None,
            tokens_of=lambda user: [t.id for t in s.list_tokens(user)],
        )
        usage_ops = TokenUsageOps(self.token_usage, s.team_exists)
        return [
            lambda p: limits_router(limit_ops, p),
            lambda p: token_usage_router(usage_ops, p),
        ]

    def start(self) -> None:
        try:
            self.limiter.refresh()  # limits in force from the first request
        except Exception:  # noqa: BLE001 - the sync thread retries
            pass
        self._thread = threading.Thread(
            target=sync_loop,
            args=(
                [self.limiter.refresh, self.usage.flush, *([self.report] if self.report else [])],
                self._stopping,
                self.every_s,
            ),
            name="gateway-sync",
            daemon=True,
        )
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
