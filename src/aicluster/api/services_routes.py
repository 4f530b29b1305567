"""Routes for services: thin wrappers over control.service_ops."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from aicluster.control.service_ops import ServiceOps
from aicluster.store.services import ServiceRecord


class DeployBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    spec: dict


class ScaleBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    replicas: int = Field(ge=0)


def service_json(ops: ServiceOps, svc: ServiceRecord, with_history: bool = False) -> dict:
    reps = ops.replicas(svc, live_only=not with_history)
    demand = ops.table.demand(svc.team, svc.name)
    d = {
        "name": svc.name, "team": svc.team, "owner": svc.owner, "spec": svc.spec,
        "engine": svc.spec.get("engine"), "model": svc.spec.get("model"),
        "replicas_min": svc.spec.get("replicas", {}).get("min"),
        "replicas_max": svc.spec.get("replicas", {}).get("max"),
        "manual_replicas": svc.manual_replicas,
        "ready": sum(1 for r in reps if r.status.value == "READY"),
        "ongoing_requests": demand.ongoing,
        "created_at": svc.created_at, "updated_at": svc.updated_at,
        "replicas": [dict(asdict(r), status=r.status.value) for r in reps],
    }  # fmt: skip
    return d


def services_router(ops: ServiceOps, principal) -> APIRouter:
    r = APIRouter()

    @r.post("/v1/services", status_code=201)
    def deploy(body: DeployBody, who=Depends(principal)):
        return service_json(ops, ops.deploy(who, body.spec))

    @r.get("/v1/services")
    def list_services(who=Depends(principal)):
        return {"services": [service_json(ops, s) for s in ops.list(who)]}

    @r.get("/v1/services/{name}")
    def get_service(name: str, team: str | None = None, who=Depends(principal)):
        return service_json(ops, ops.get(who, name, team), with_history=True)

    @r.post("/v1/services/{name}/scale")
    def scale(name: str, body: ScaleBody, team: str | None = None, who=Depends(principal)):
        return service_json(ops, ops.scale(who, name, team, body.replicas))

    @r.delete("/v1/services/{name}")
    def delete(name: str, team: str | None = None, who=Depends(principal)):
        return service_json(ops, ops.delete(who, name, team))

    return r
