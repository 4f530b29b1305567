"""`GET /metrics` in Prometheus' text format (a bearer token is needed, as everywhere).
Admins get every series; members and viewers their team's and the cluster-wide ones
(control.metrics: `Metrics.scoped`)."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from aicluster.api.errors import responses


def metrics_router(metrics, principal) -> APIRouter:
    r = APIRouter()

    @r.get("/metrics", responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}, **responses(401)})
    def scrape(who=Depends(principal)):
        return Response(generate_latest(metrics.scoped(who)), media_type=CONTENT_TYPE_LATEST)

    return r
