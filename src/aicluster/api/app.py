"""Routes. Each one authenticates, calls one service function and shapes JSON."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field

from aicluster.control.service import BadRequest, ForbiddenError, NotFoundError, Services
from aicluster.control.snapshot import allocations, job_workload
from aicluster.core.lifecycle import JobStatus
from aicluster.core.model import Quota, Res
from aicluster.spec.errors import SpecError
from aicluster.store.db import Conflict, JobRecord, NotFound, Principal

_bearer = HTTPBearer(auto_error=False)


class SubmitBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    spec: dict
    workdir: str | None = None


class NodeActionBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    grace_s: float = Field(default=300.0, ge=0)


class QuotaBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpus: int = Field(ge=0)
    borrow_gpus: int | None = Field(default=None, ge=0)
    lend_gpus: int | None = Field(default=None, ge=0)
    cpus: float | None = Field(default=None, ge=0)
    memory: int | None = Field(default=None, ge=0)
    weight: float = Field(default=1.0, gt=0)
    cohort: str = "default"


class TeamBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str


class TokenBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user: str
    team: str | None = None
    role: str = "member"


def job_json(job: JobRecord, events=None) -> dict:
    d = asdict(job)
    d["status"] = job.status.value
    d["workers"] = int(job.spec.get("workers", 1))
    d.pop("seq", None)
    d["has_workdir"] = bool(d.pop("workdir", None))
    if events is not None:
        d["events"] = [asdict(e) for e in events]
    return d


def _error(status: int, message: str, **extra) -> JSONResponse:
    return JSONResponse({"detail": {"message": message, **extra}}, status_code=status)


def create_app(services: Services, routers=()) -> FastAPI:
    """`routers`: factories `(principal_dependency) -> APIRouter` for more routes
    (services, the gateway, artifacts), so each part authenticates the same way."""
    app = FastAPI(title="aicluster", version="0.1.0", description="aicluster control-plane API")

    @app.exception_handler(SpecError)
    async def _spec_error(_req: Request, exc: SpecError):
        return _error(422, str(exc), issues=exc.to_dict()["issues"])

    for exc_type, status in (
        (NotFoundError, 404), (NotFound, 404), (ForbiddenError, 403),
        (BadRequest, 400), (Conflict, 409),
    ):  # fmt: skip
        app.add_exception_handler(exc_type, _handler(status))

    def principal(creds: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> Principal:
        who = services.store.authenticate(creds.credentials) if creds else None
        if who is None:
            raise _Unauthorized()
        return who

    @app.exception_handler(_Unauthorized)
    async def _unauth(_req: Request, _exc: _Unauthorized):
        resp = _error(401, "missing or invalid API token")
        resp.headers["WWW-Authenticate"] = "Bearer"
        return resp

    @app.get("/healthz")
    def healthz():
        return {"status": "ok"}

    @app.get("/v1/whoami")
    def whoami(who: Principal = Depends(principal)):
        return asdict(who)

    @app.post("/v1/jobs", status_code=201)
    def submit(body: SubmitBody, who: Principal = Depends(principal)):
        return job_json(services.submit(who, body.spec, body.workdir))

    @app.get("/v1/jobs")
    def list_jobs(
        status: list[str] | None = Query(default=None),
        team: str | None = None,
        who: Principal = Depends(principal),
    ):
        return {"jobs": [job_json(j) for j in services.list_jobs(who, status, team)]}

    @app.get("/v1/jobs/{job_id}")
    def get_job(job_id: str, who: Principal = Depends(principal)):
        job = services.get_job(who, job_id)
        return job_json(job, services.store.list_events(object_id=job.id))

    @app.post("/v1/jobs/{job_id}/cancel")
    def cancel(job_id: str, who: Principal = Depends(principal)):
        return job_json(services.cancel(who, job_id))

    @app.get("/v1/jobs/{job_id}/logs")
    def logs(
        job_id: str,
        rank: int = 0,
        attempt: int | None = None,
        offset: int = Query(default=0, ge=0),
        who: Principal = Depends(principal),
    ):
        data, job, att = services.read_logs(who, job_id, rank, attempt, offset)
        headers = {
            "X-Next-Offset": str(offset + len(data)),
            "X-Job-Status": job.status.value,
            "X-Attempt": str(att),
        }
        return Response(data, media_type="text/plain; charset=utf-8", headers=headers)

    @app.get("/v1/nodes")
    def nodes(who: Principal = Depends(principal)):
        active = services.store.list_jobs(statuses=[JobStatus.ADMITTED, JobStatus.RUNNING])
        used = allocations([job_workload(j) for j in active] + services.other_workloads())
        states = services.node_states()
        out = []
        for n in services.engine.nodes():
            d = asdict(n)
            d["allocated"] = asdict(used.get(n.node_id, Res()))
            rec = states.get(n.node_id)
            d["state"] = rec.state.value if rec else ("Ready" if n.alive else "Down")
            d["reason"] = rec.reason if rec else None
            d["checks"] = rec.checks if rec else []
            out.append(d)
        return {"nodes": out}

    @app.post("/v1/nodes/{node}/{action}")
    def node_action(node: str, action: str, body: NodeActionBody | None = None,
                    who: Principal = Depends(principal)):  # fmt: skip
        if action not in ("cordon", "drain", "uncordon"):
            raise NotFoundError(f"unknown node action {action!r}: cordon, drain or uncordon")
        grace = body.grace_s if body else 300.0
        rec = services.node_action(who, node, action, grace)
        return {"node_id": rec.node_id, "state": rec.state.value, "reason": rec.reason}

    @app.get("/v1/events")
    def events(
        after: int = Query(default=0, ge=0),
        object_id: str | None = None,
        who: Principal = Depends(principal),
    ):
        return {"events": [asdict(e) for e in services.events(who, after, object_id)]}

    @app.get("/v1/teams")
    def teams(who: Principal = Depends(principal)):
        names = services.store.list_teams()
        return {"teams": names if who.is_admin else [t for t in names if t == who.team]}

    @app.post("/v1/teams", status_code=201)
    def create_team(body: TeamBody, who: Principal = Depends(principal)):
        services.create_team(who, body.name)
        return {"name": body.name}

    @app.put("/v1/teams/{team}/quotas/{pool}")
    def set_quota(team: str, pool: str, body: QuotaBody, who: Principal = Depends(principal)):
        q = services.set_quota(who, Quota(team=team, pool=pool, **body.model_dump()))
        return asdict(q)

    @app.get("/v1/quotas")
    def quotas(who: Principal = Depends(principal)):
        return {"quotas": [asdict(q) for q in services.list_quotas(who)]}

    @app.get("/v1/queue")
    def queue(who: Principal = Depends(principal)):
        return {"queue": services.pending_queue(who)}

    @app.post("/v1/tokens", status_code=201)
    def create_token(body: TokenBody, who: Principal = Depends(principal)):
        token = services.create_token(who, body.user, body.team, body.role)
        return {"user": body.user, "team": body.team, "role": body.role, "token": token}

    for make_router in routers:
        app.include_router(make_router(principal))
    return app


class _Unauthorized(Exception):
    pass


def _handler(status: int):
    async def handle(_req: Request, exc: Exception):
        return _error(status, str(exc).strip("'\""))

    return handle
