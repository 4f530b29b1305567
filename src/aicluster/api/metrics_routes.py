"""`GET /metrics` in Prometheus' text format (a bearer token is needed, as everywhere)."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest


def metrics_router(metrics, principal) -> APIRouter:
    r = APIRouter()

    @r.get("/metrics")
    def scrape(_who=Depends(principal)):
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return r
