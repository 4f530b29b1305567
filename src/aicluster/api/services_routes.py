"""Routes for services: thin wrappers over control.service_ops."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Depends, Path, Query
from pydantic import Field

from aicluster.api.bodies import Body
from aicluster.api.errors import BODY, responses
from aicluster.api.paging import CURSOR, LIMIT, page_body
from aicluster.api.strict_json import StrictJSONRoute, finite
from aicluster.control.endpoint_ops import EndpointOps
from aicluster.store.services import ServiceRecord


class DeployBody(Body):
    spec: dict = Field(description="a service spec (kind: service)")


class ScaleBody(Body):
    replicas: int = Field(ge=0, le=1000)


ServiceName = Path(max_length=63, description="a service of the caller's team")
TeamQuery = Query(default=None, max_length=63, description="admins: the service's team")


def service_json(ops: EndpointOps, svc: ServiceRecord, with_history: bool = False) -> dict:
    reps = ops.replicas(svc, live_only=not with_history)
    demand = ops.demand(svc.team, svc.name)
    d = {
        "name": svc.name,
        "team": svc.team,
        "owner": svc.owner,
        "spec": svc.spec.model_dump(mode="json"),
        "engine": svc.spec.engine,
        "model": svc.spec.model,
        "replicas_min": svc.spec.replicas.min,
        "replicas_max": svc.spec.replicas.max,
        "manual_replicas": svc.manual_replicas,
        "ready": sum(1 for r in reps if r.status.value == "READY"),
        "ongoing_requests": demand.ongoing,
        "created_at": svc.created_at,
        "updated_at": svc.updated_at,
        "replicas": [
            dict(asdict(r), status=r.status.value, engine_metrics=ops.table.engine_metrics(r.id))
            for r in reps
        ],
    }
    return finite(d)


def services_router(ops: EndpointOps, principal) -> APIRouter:
    r = APIRouter(route_class=StrictJSONRoute)

    @r.post("/v1/services", status_code=201, responses=responses(401, 403, 404, 409, *BODY))
    def deploy(body: DeployBody, who=Depends(principal)):
        return service_json(ops, ops.deploy(who, body.spec))

    @r.get("/v1/services", responses=responses(400, 401, 422))
    def list_services(limit: int = LIMIT, cursor: str | None = CURSOR, who=Depends(principal)):
        """Services by (team, name), a page at a time (api.paging)."""
        team = None if who.is_admin else who.team
        page, more = ops.services.page(team, limit, cursor)
        return page_body("services", [service_json(ops, s) for s in page], more)

    @r.get("/v1/services/{name}", responses=responses(401, 404, 422))
    def get_service(name: str = ServiceName, team: str | None = TeamQuery, who=Depends(principal)):
        return service_json(ops, ops.get(who, name, team), with_history=True)

    @r.post("/v1/services/{name}/scale", responses=responses(401, 403, 404, *BODY))
    def scale(
        body: ScaleBody,
        name: str = ServiceName,
        team: str | None = TeamQuery,
        who=Depends(principal),
    ):
        return service_json(ops, ops.scale(who, name, team, body.replicas))

    @r.delete("/v1/services/{name}", responses=responses(401, 403, 404, 422))
    def delete(name: str = ServiceName, team: str | None = TeamQuery, who=Depends(principal)):
        return service_json(ops, ops.delete(who, name, team))

    return r
