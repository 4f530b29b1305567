"""Routes of gateway processes (gateway.process), admins' tokens only.

- `GET /v1/gateway/feed?services=H&tokens=H&limits=H&wait=S`: the feed's sections whose
  content hash differs from the one given (all of them without hashes), and every
  current hash. With `wait`, the answer waits up to that many seconds (at most 30) for a
  change: a long poll, so a revocation reaches every gateway within about a second.
- `POST /v1/gateway/report`: a gateway's demand per service (control.gateway_feed).
- `POST /v1/gateway/usage`: a batch of usage records (gateway.usage); a batch id taken
  before is acknowledged again and counted once.

The feed carries replicas' secrets and tokens' digests: never for anyone but admins.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from fastapi import APIRouter, Depends, Query
from starlette.concurrency import run_in_threadpool

from aicluster.api.errors import BODY, responses
from aicluster.api.strict_json import StrictJSONRoute
from aicluster.control.api_ops import ForbiddenError
from aicluster.control.gateway_feed import MAX_WAIT_S, GatewayFeed, GatewayReport
from aicluster.control.token_usage import UsageBatch
from aicluster.store.gateway_reports import GatewayReports, ServiceDemand

POLL_S = 0.1


def _hash_param():
    """A section's hash, as the gateway holds it (one Query object per parameter: FastAPI
    names a shared one after the first parameter that uses it)."""
    return Query(default=None, max_length=64, pattern=r"^[0-9a-f]*$")


def gateway_feed_router(
    feed: GatewayFeed, reports: GatewayReports, accept: Callable[[dict], bool], principal
) -> APIRouter:
    """`accept`: the usage ledger's (control.token_usage.TokenLedger.accept)."""
    r = APIRouter(route_class=StrictJSONRoute)

    def admin(who=Depends(principal)):
        if not who.is_admin:
            raise ForbiddenError("gateway routes need an admin token")
        return who

    @r.get("/v1/gateway/feed", responses=responses(401, 403, 422))
    async def gateway_feed(
        services: str | None = _hash_param(),
        tokens: str | None = _hash_param(),
        limits: str | None = _hash_param(),
        wait: float = Query(default=0.0, ge=0, le=MAX_WAIT_S, allow_inf_nan=False),
        who=Depends(admin),
    ):
        known = {"services": services, "tokens": tokens, "limits": limits}
        deadline = time.monotonic() + wait
        while True:
            out = await run_in_threadpool(feed.changes, known)
            if out["sections"] or time.monotonic() >= deadline:
                return out
            await asyncio.sleep(POLL_S)

    @r.post("/v1/gateway/report", responses=responses(401, 403, *BODY))
    def gateway_report(body: GatewayReport, who=Depends(admin)):
        reports.put(body.gateway_id, [ServiceDemand(**d.model_dump()) for d in body.services])
        return {"ok": True}

    @r.post("/v1/gateway/usage", responses=responses(401, 403, *BODY))
    def gateway_usage(body: UsageBatch, who=Depends(admin)):
        return {"accepted": accept(body.model_dump())}

    return r
