"""Doctor report routes: thin wrappers over control.doctor.DoctorOps.

`POST /v1/doctor/reports` (admins) judges a finished doctor job from its logs against
the expectations in the body and stores the report (201 with it); `GET
/v1/doctor/reports` lists stored reports newest first, a page at a time (api.paging),
`node` keeping those that measured one node. Bad input is a 400 or 422 naming the field.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request
from pydantic import Field

from aicluster.api.audit import note_target
from aicluster.api.bodies import Body
from aicluster.api.errors import BODY, responses
from aicluster.api.paging import CURSOR, LIMIT, page_body
from aicluster.api.strict_json import StrictJSONRoute, finite
from aicluster.control.doctor import DoctorOps
from aicluster.specs.limits import MAX_TEXT

ROUTE = "/v1/doctor/reports"
ID_PATTERN = r"^[A-Za-z0-9_.:-]+$"  # job and node ids (never NUL, which PostgreSQL refuses)


class ExpectationBody(Body):
    value: float = Field(gt=0, le=1e15, description="what the check should reach, its unit")
    source: str = Field(default="given", max_length=MAX_TEXT, description="where it comes from")
    higher: bool = Field(default=True, description="higher is better (latency: false)")


class DoctorReportBody(Body):
    job_id: str = Field(
        min_length=1, max_length=64, pattern=ID_PATTERN, description="a SUCCEEDED doctor job"
    )
    expect: dict[str, ExpectationBody] = Field(
        default_factory=dict, max_length=64, description="per check (core.doctor.CHECKS)"
    )


def doctor_router(ops: DoctorOps, principal) -> APIRouter:
    r = APIRouter(route_class=StrictJSONRoute)

    @r.post(ROUTE, status_code=201, responses=responses(401, 403, 404, 409, *BODY))
    def record_doctor_report(request: Request, body: DoctorReportBody, who=Depends(principal)):
        note_target(request, f"job={body.job_id}")
        expect = {k: v.model_dump() for k, v in body.expect.items()}
        return finite(ops.record(who, body.job_id, expect))

    @r.get(ROUTE, responses=responses(400, 401, 422))
    def doctor_reports(
        node: str | None = Query(
            default=None, max_length=128, pattern=ID_PATTERN, description="a Ray node id"
        ),
        limit: int = LIMIT,
        cursor: str | None = CURSOR,
        who=Depends(principal),
    ):
        page, more = ops.page(who, limit, cursor, node)
        return page_body("reports", finite(page), more)

    return r
