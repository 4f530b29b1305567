"""Routes. Each one authenticates, calls one service function and shapes JSON."""

from __future__ import annotations

import time
from dataclasses import asdict, fields

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from aicluster.api.audit import PRINCIPAL, AuditMiddleware, note_target
from aicluster.api.audit_routes import audit_router
from aicluster.api.bodies import (
    NodeActionBody,
    QuotaBody,
    SubmitBatchBody,
    SubmitBody,
    TeamBody,
    TokenBody,
)
from aicluster.api.budgets_routes import budgets_router
from aicluster.api.errors import BODY, error, install_error_handlers, responses
from aicluster.api.limits import BodyLimitMiddleware
from aicluster.api.paging import CURSOR, LIMIT, page_body
from aicluster.api.strict_json import StrictJSONRoute, finite
from aicluster.api.tokens_routes import tokens_router
from aicluster.control.api_ops import (
    AmbiguousJobName,
    ApiOps,
    BadRequest,
    ForbiddenError,
    NotFoundError,
)
from aicluster.control.audit import AuditOps
from aicluster.control.budgets import QueueFull
from aicluster.control.logs import LogsRemoved
from aicluster.control.nodes_loop import current as current_nodes
from aicluster.control.recovery import recovery
from aicluster.control.snapshot import allocations, job_workload
from aicluster.control.tokens import TokenOps
from aicluster.core.lifecycle import JobStatus
from aicluster.core.model import Quota, Res
from aicluster.specs.limits import INT64_MAX, MAX_TEXT
from aicluster.specs.names import NAME_PATTERN
from aicluster.store.audit import AuditStore
from aicluster.store.cursors import BadCursor, decode, page_of
from aicluster.store.errors import Conflict, NotFound
from aicluster.store.identity import Principal, Refusal
from aicluster.store.jobs import JobRecord

_bearer = HTTPBearer(auto_error=False)


_JOB_FIELDS = tuple(f.name for f in fields(JobRecord) if f.name != "spec")


def job_json(job: JobRecord, events=None, attempts=None, now: float | None = None) -> dict:
    # field by field, not asdict(): that deep-copies the spec model only to replace it
    d = {name: getattr(job, name) for name in _JOB_FIELDS}
    d["placement"] = list(job.placement) if job.placement is not None else None
    d["spec"] = job.spec.model_dump(mode="json")  # every field, defaults included
    d["status"] = job.status.value
    d["requeue_cause"] = job.requeue_cause.value if job.requeue_cause else None
    d["wait_kind"] = job.wait_kind.value if job.wait_kind else None
    d["workers"] = job.spec.workers
    d.pop("seq", None)
    d["has_workdir"] = bool(d.pop("workdir", None))
    if events is not None:
        d["events"] = [asdict(e) for e in events]
    if attempts is not None:  # store.jobs.AttemptRecord, oldest first
        d["attempts"] = [
            {
                "attempt": a.attempt,
                "placement": a.placement,
                "admitted_at": a.admitted_at,
                "started_at": a.started_at,
                "ended_at": a.ended_at,
                "interrupted_at": a.interrupted_at,
                "runtime_s": a.runtime_s(now if now is not None else job.updated_at),
                "end_reason": a.end_reason,
                "recovery": _recovery_json(attempts[i - 1], a) if i else None,
            }
            for i, a in enumerate(attempts)
        ]
    return finite(d)


def _recovery_json(before, a) -> dict | None:
    """How `a` recovered the attempt `before` it (control.recovery), the measured phases
    only: the replay estimate needs the job's checkpoints and is said in the event."""
    took = recovery(before, a, a.started_at) if a.started_at is not None else None
    if took is None:
        return None
    return {
        "cause": took.cause,
        "total_s": took.total_s,
        "detection_s": took.detection_s,
        "queue_s": took.queue_s,
        "launch_s": took.launch_s,
    }


# Error statuses per kind of route, declared in the OpenAPI document.
AUTHED = (401,)
SCOPED = (401, 404)  # an object of another team is "not found"
WRITE = (401, 403)  # viewers change nothing
ADMIN = (401, 403)  # admins only
SCOPED_JOB = (*SCOPED, 409)  # a job's name an admin uses may match jobs of several teams
JobId = Path(
    max_length=128,
    description="a job id; or a job name: the newest job of that name in the caller's team "
    "(for an admin, in any team: 409 when those are in several teams); or TEAM:NAME",
)
TeamName = Path(pattern=NAME_PATTERN, max_length=63, description="a team")
PoolName = Path(pattern=NAME_PATTERN, max_length=63, description="a pool")


def create_app(services: ApiOps, routers=(), audit: AuditStore | None = None) -> FastAPI:
    """`routers`: factories `(principal_dependency) -> APIRouter` for more routes
    (services, the gateway, artifacts), so each part authenticates the same way.
    `audit`: where the audit log goes (api.audit; default: the store's, kept a year)."""
    audit = audit if audit is not None else AuditStore(services.store)
    app = FastAPI(title="aicluster", version="0.1.0", description="aicluster control-plane API")
    app.router.route_class = StrictJSONRoute  # no NaN, Infinity, 2**64 or deep nesting
    app.add_middleware(BodyLimitMiddleware)  # before parsing and before authentication
    app.add_middleware(AuditMiddleware, audit=audit)  # outside it: a 413 is audited too
    install_error_handlers(
        app,
        {
            NotFoundError: 404,
            NotFound: 404,
            ForbiddenError: 403,
            BadRequest: 400,
            Conflict: 409,
            QueueFull: 429,
            BadCursor: 400,  # names `cursor`
            LogsRemoved: 410,
        },
    )

    def principal(
        request: Request, creds: HTTPAuthorizationCredentials | None = Depends(_bearer)
    ) -> Principal:
        who = services.store.identify(creds.credentials) if creds else None
        if not isinstance(who, Principal):
            raise _Unauthorized(who)
        setattr(request.state, PRINCIPAL, who)  # for the audit log (api.audit)
        if who.job_id is not None and not job_token_may(request.method, request.url.path):
            raise ForbiddenError(
                "a job's token may only read its team's artifacts and write its own checkpoints"
            )
        return who

    @app.exception_handler(AmbiguousJobName)
    async def _ambiguous(_req: Request, exc: AmbiguousJobName):
        candidates = [{"id": j.id, "team": j.team} for j in exc.candidates]
        return error(409, str(exc), field="job_id", candidates=candidates)

    @app.exception_handler(_Unauthorized)
    async def _unauth(_req: Request, exc: _Unauthorized):
        resp = error(401, exc.message)
        resp.headers["WWW-Authenticate"] = "Bearer"
        return resp

    @app.get("/healthz")
    def healthz():
        return {"status": "ok"}

    @app.get("/v1/whoami", responses=responses(*AUTHED))
    def whoami(who: Principal = Depends(principal)):
        return asdict(who)

    @app.post("/v1/jobs", status_code=201, responses=responses(*WRITE, *BODY, 429))
    def submit(request: Request, body: SubmitBody, who: Principal = Depends(principal)):
        job = services.submit(who, body.spec, body.workdir)
        note_target(request, f"job={job.id}")
        return job_json(job)

    @app.post("/v1/jobs/batch", status_code=201, responses=responses(*WRITE, *BODY, 429))
    def submit_batch(request: Request, body: SubmitBatchBody, who=Depends(principal)):
        """Up to 1,000 jobs in one request and one transaction: all stored, or none."""
        jobs = services.submit_batch(who, body.specs, body.workdir)
        note_target(request, f"jobs={len(jobs)}")
        return {"jobs": [job_json(j) for j in jobs]}

    @app.get("/v1/jobs", responses=responses(*AUTHED, 400, 422))
    def list_jobs(
        status: list[str] | None = Query(default=None, max_length=16),
        team: str | None = Query(default=None, max_length=63),
        limit: int = LIMIT,
        cursor: str | None = CURSOR,
        who: Principal = Depends(principal),
    ):
        """Jobs newest first, a page at a time (api.paging)."""
        jobs, more = services.page_jobs(who, status, team, limit, cursor)
        return page_body("jobs", [job_json(j) for j in jobs], more)

    @app.get("/v1/jobs/{job_id}", responses=responses(*SCOPED_JOB, 422))
    def get_job(job_id: str = JobId, who: Principal = Depends(principal)):
        job = services.get_job(who, job_id)
        store = services.store
        return job_json(
            job, store.list_events(object_id=job.id), store.job_attempts(job.id), store.clock()
        )

    @app.post("/v1/jobs/{job_id}/cancel", responses=responses(*SCOPED_JOB, *WRITE, 422))
    def cancel(job_id: str = JobId, who: Principal = Depends(principal)):
        return job_json(services.cancel(who, job_id))

    @app.get("/v1/jobs/{job_id}/logs", responses=responses(*SCOPED_JOB, 400, 410, 422))
    def logs(
        job_id: str = JobId,
        rank: int = Query(default=0, ge=0, le=INT64_MAX),
        attempt: int | None = Query(default=None, ge=0, le=INT64_MAX),
        offset: int = Query(default=0, ge=0, le=INT64_MAX),
        who: Principal = Depends(principal),
    ):
        data, job, att, nxt = services.read_logs(who, job_id, rank, attempt, offset)
        headers = {
            "X-Next-Offset": str(nxt),  # past a marker of bytes the log cap dropped
            "X-Job-Status": job.status.value,
            "X-Attempt": str(att),
        }
        return Response(data, media_type="text/plain; charset=utf-8", headers=headers)

    @app.get("/v1/nodes", responses=responses(*AUTHED, 400, 422))
    def nodes(limit: int = LIMIT, cursor: str | None = CURSOR, who=Depends(principal)):
        """Nodes by id, a page at a time (api.paging): the engine lists them in memory."""
        (after,) = decode(cursor, "nodes", str) or ("",)
        used = services.allocated()  # the loop's last cycle, when this process leads
        if used is None:  # a follower: read what runs now
            active = services.store.list_jobs(
                statuses=[JobStatus.ADMITTED, JobStatus.RUNNING], limit=None
            )
            used = allocations([job_workload(j) for j in active] + services.other_workloads())
        states = services.node_states()
        out = []
        infos = services.engine.nodes()
        shown = sorted(
            ((n, rec) for n, rec in current_nodes(infos, states) if n.node_id > after),
            key=lambda nr: nr[0].node_id,
        )
        shown, more = page_of(shown, limit, "nodes", lambda nr: (nr[0].node_id,))
        for n, rec in shown:  # retired ones: only events remain
            d = asdict(n)
            d["incarnations"] = rec.incarnations if rec else 1
            d["allocated"] = asdict(used.get(n.node_id, Res()))
            # Ray's word that a node is dead wins over a state the node loop has not yet
            # caught up with (it updates once per tick): a dead node is never shown Ready.
            stale = rec is not None and not n.alive and rec.state.value != "Down"
            d["state"] = "Down" if not n.alive else (rec.state.value if rec else "Ready")
            d["reason"] = "node_lost" if stale else (rec.reason if rec else None)
            d["checks"] = rec.checks if rec else []
            out.append(d)
        return page_body("nodes", out, more)

    @app.post("/v1/nodes/{node}/{action}", responses=responses(*ADMIN, 404, 409, *BODY))
    def node_action(
        node: str = Path(max_length=MAX_TEXT),
        action: str = Path(max_length=64),
        body: NodeActionBody | None = None,
        who: Principal = Depends(principal),
    ):
        # retire: remove a Down node from the listings now (409 for a live one)
        if action not in ("cordon", "drain", "uncordon", "retire"):
            raise NotFoundError(
                f"unknown node action {action!r}: cordon, drain, uncordon or retire"
            )
        grace = body.grace_s if body else 300.0
        rec = services.node_action(who, node, action, grace)
        return {
            "node_id": rec.node_id,
            "machine_id": rec.machine_id,
            "name": rec.name,
            "state": rec.state.value,
            "reason": rec.reason,
        }

    @app.get("/v1/events", responses=responses(*AUTHED, 400, 422))
    def events(
        after: int = Query(default=0, ge=0, le=INT64_MAX),
        object_id: str | None = Query(default=None, max_length=MAX_TEXT),
        limit: int = LIMIT,
        cursor: str | None = CURSOR,
        who: Principal = Depends(principal),
    ):
        """Events oldest first after `after`, a page at a time (api.paging)."""
        page, more = services.events(who, after, object_id, limit, cursor)
        return page_body("events", [asdict(e) for e in page], more)

    @app.get("/v1/teams", responses=responses(*AUTHED))
    def teams(who: Principal = Depends(principal)):
        names = services.store.list_teams()
        return {"teams": names if who.is_admin else [t for t in names if t == who.team]}

    @app.post("/v1/teams", status_code=201, responses=responses(*ADMIN, 409, *BODY))
    def create_team(request: Request, body: TeamBody, who: Principal = Depends(principal)):
        note_target(request, f"team={body.name}")
        services.create_team(who, body.name)
        return {"name": body.name}

    @app.put("/v1/teams/{team}/quotas/{pool}", responses=responses(*ADMIN, 404, *BODY))
    def set_quota(
        team: str = TeamName,
        pool: str = PoolName,
        *,
        body: QuotaBody,
        who: Principal = Depends(principal),
    ):
        q = services.set_quota(who, Quota(team=team, pool=pool, **body.model_dump()))
        return asdict(q)

    @app.get("/v1/quotas", responses=responses(*AUTHED))
    def quotas(who: Principal = Depends(principal)):
        return {"quotas": [asdict(q) for q in services.list_quotas(who)]}

    @app.get("/v1/queue", responses=responses(*AUTHED, 400, 422))
    def queue(limit: int = LIMIT, cursor: str | None = CURSOR, who=Depends(principal)):
        """Pending workloads in the scheduler's order, a page at a time (control.queue_pages:
        what a cursor means while the queue reorders)."""
        page, more = services.pending_queue(who, limit, cursor)
        return page_body("queue", page, more)

    @app.post("/v1/tokens", status_code=201, responses=responses(*ADMIN, 404, 409, *BODY))
    def create_token(request: Request, body: TokenBody, who: Principal = Depends(principal)):
        note_target(request, f"user={body.user}")
        token, t = services.create_token(who, body.user, body.team, body.role, body.expires_in)
        made = {"user": body.user, "team": body.team, "role": body.role, "token": token}
        return finite({**made, "id": t.id, "prefix": t.prefix, "expires_at": t.expires_at})

    app.include_router(audit_router(AuditOps(audit), principal))
    app.include_router(tokens_router(TokenOps(services.store), principal))
    if services.budgets is not None:
        app.include_router(budgets_router(services.budgets, principal))
    for make_router in routers:
        app.include_router(make_router(principal))
    return app


def job_token_may(method: str, path: str) -> bool:
    """The routes a job's scoped token reaches (store.identity.Principal says which artifacts)."""
    if path == "/v1/whoami":
        return True
    if path.startswith("/v1/artifacts/uploads"):
        return True  # its own upload sessions; ArtifactService checks the artifact's name
    if method == "POST" and path.startswith("/v1/artifacts/") and path.endswith("/grant"):
        return "/versions/" in path  # a read grant: where to fetch a version it may read
    if method == "POST" and path.startswith("/v1/artifacts/") and path.endswith("/prune"):
        return True  # retention of its own checkpoints; ArtifactService checks the name
    return method in ("GET", "HEAD") and path.startswith("/v1/artifacts")


class _Unauthorized(Exception):
    """401; the message says why when the token is known: expired or revoked."""

    def __init__(self, refusal: Refusal | None = None):
        super().__init__()
        if refusal is None:
            self.message = "missing or invalid API token"
            return
        at = f" at {_utc(refusal.at)}" if refusal.at is not None else ""
        self.message = f"API token {refusal.why}{at}: ask an admin for a new one"


def _utc(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))
