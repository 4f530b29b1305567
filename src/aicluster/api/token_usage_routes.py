"""Token usage and token price routes: thin wrappers over control.token_usage.

`GET /v1/usage/tokens` sums what the gateways counted (requests, errors, prompt and
completion tokens, cost) since a time, by team, user, token, service or model (members:
their team's callers only). `PUT /v1/prices/tokens` (admins) sets per-million-token
rates of a service or every service; `GET /v1/prices/tokens` lists them. Bad input is a
400 or 422 naming the field.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query
from pydantic import Field

from aicluster.api.bodies import Body
from aicluster.api.errors import BODY, responses
from aicluster.api.strict_json import StrictJSONRoute, finite
from aicluster.control.token_usage import TokenUsageOps

MRate = Field(default=None, ge=0, le=1e9, description="per million tokens, in your currency")


class TokenPriceBody(Body):
    service: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=r"^([a-z0-9][a-z0-9-]*/)?[a-z0-9][a-z0-9-]*$",
        description="TEAM/NAME, or NAME (that service of any team); none: every service",
    )
    input_mtok: float | None = MRate
    output_mtok: float | None = MRate
    effective_from: float | None = Field(
        default=None, ge=0, le=1e11, description="UNIX seconds; default now; never in the past"
    )


def token_usage_router(ops: TokenUsageOps, principal) -> APIRouter:
    r = APIRouter(route_class=StrictJSONRoute)

    @r.get("/v1/usage/tokens", responses=responses(400, 401, 404, 422))
    def token_usage(
        since: str = Query(
            default="30d",
            max_length=64,
            description="minutes since: 7d, 12h, 30m, 90s, 2w ago, or an ISO 8601 time",
        ),
        team: str | None = Query(default=None, max_length=63, description="one caller team"),
        by: str | None = Query(
            default="team", max_length=32, description="team, user, token, service or model"
        ),
        who=Depends(principal),
    ):
        return finite(ops.report(who, since, team, by or None))

    @r.put("/v1/prices/tokens", responses=responses(401, 403, *BODY))
    def set_token_price(body: TokenPriceBody, who=Depends(principal)):
        return finite(
            ops.set_price(who, body.service, body.input_mtok, body.output_mtok, body.effective_from)
        )

    @r.get("/v1/prices/tokens", responses=responses(401))
    def token_prices(who=Depends(principal)):
        return finite(ops.prices(who))

    return r
