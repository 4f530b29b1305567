"""The usage-over-time route: a thin wrapper over control.usage_series.UsageSeriesOps.

`GET /v1/usage/series?since=30d&step=1d&metric=gpu_hours|cost_usd|queue_wait_s&team=`
answers one series of points per team (the dashboard's Usage page draws them). Members
and viewers see their own team only; bad input is a 400 or 422 naming the field.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query

from aicluster.api.errors import responses
from aicluster.api.strict_json import StrictJSONRoute, finite
from aicluster.control.usage_series import UsageSeriesOps


def usage_series_router(ops: UsageSeriesOps, principal) -> APIRouter:
    r = APIRouter(route_class=StrictJSONRoute)

    @r.get("/v1/usage/series", responses=responses(400, 401, 404, 422))
    def usage_series(
        since: str = Query(
            default="30d",
            max_length=64,
            description="from: 7d, 12h, 2w ago, or an ISO 8601 time (its bucket's start)",
        ),
        step: str = Query(
            default="1d",
            max_length=16,
            description="bucket width: 1d, 7d, 6h, ... (whole days for gpu_hours, cost_usd)",
        ),
        metric: str = Query(
            default="gpu_hours",
            max_length=32,
            description="gpu_hours, cost_usd or queue_wait_s",
        ),
        team: str | None = Query(default=None, max_length=63, description="one team"),
        who=Depends(principal),
    ):
        return finite(ops.series(who, since, step, metric, team))

    return r
