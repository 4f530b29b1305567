"""Usage and price routes: thin wrappers over control.usage.UsageOps.

`GET /v1/usage` sums the ledger's lines (ended job attempts and replica runs) that ended
since a time, by a grouping, with each team's storage (daily samples) and its cost;
`GET /v1/usage/lines` lists those lines; `PUT /v1/prices` (admins) sets a rate
card, `GET /v1/prices` lists them with the catalog's defaults. Members and viewers see
their team's usage only. Bad input is a 400 or 422 naming the field.
"""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Depends, Query
from pydantic import Field

from aicluster.api.bodies import Body
from aicluster.api.errors import BODY, responses
from aicluster.api.strict_json import StrictJSONRoute, finite
from aicluster.control.usage import PRICES, UsageOps
from aicluster.specs.limits import INT64_MAX
from aicluster.specs.names import Name

Rate = Field(default=None, ge=0, le=1e9, description="per hour, in the currency of your prices")


class PriceBody(Body):
    pool: Name | None = Field(default=None, description="the pool it prices; none: every pool")
    gpu_model: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="the GPU model it prices (catalog names and aliases match); none: every",
    )
    gpu_hour: float | None = Rate
    cpu_hour: float | None = Rate
    memory_gib_hour: float | None = Rate
    storage_gib_month: float | None = Field(
        default=None, ge=0, le=1e9, description="per GiB kept a month (every pool only)"
    )
    effective_from: float | None = Field(
        default=None, ge=0, le=1e11, description="UNIX seconds; default now; never in the past"
    )


Since = Query(
    default="30d",
    max_length=64,
    description="lines that ended since: 7d, 12h, 30m, 90s, 2w ago, or an ISO 8601 time",
)
TeamQ = Query(default=None, max_length=63, description="one team (members: their own)")


def usage_router(ops: UsageOps, principal) -> APIRouter:
    r = APIRouter(route_class=StrictJSONRoute)

    @r.get("/v1/usage", responses=responses(400, 401, 404, 422))
    def usage(
        since: str = Since,
        team: str | None = TeamQ,
        by: str | None = Query(
            default="team",
            max_length=32,
            description="team, user, job, service, kind, pool, gpu_model or end_reason",
        ),
        who=Depends(principal),
    ):
        return finite(ops.report(who, since, team, by or None))

    @r.get("/v1/usage/lines", responses=responses(400, 401, 404, 422))
    def usage_lines(
        since: str = Since,
        team: str | None = TeamQ,
        limit: int = Query(default=1000, ge=1, le=10000),
        after: int = Query(default=0, ge=0, le=INT64_MAX, description="a line id: page on"),
        who=Depends(principal),
    ):
        return finite({"lines": ops.lines(who, since, team, limit, after)})

    @r.put("/v1/prices", responses=responses(401, 403, *BODY))
    def set_price(body: PriceBody, who=Depends(principal)):
        rates = {n: getattr(body, n) for n in PRICES}
        p = ops.set_price(who, body.pool, body.gpu_model, rates, body.effective_from)
        return finite(asdict(p))

    @r.get("/v1/prices", responses=responses(401))
    def prices(who=Depends(principal)):
        return finite(ops.prices(who))

    return r
