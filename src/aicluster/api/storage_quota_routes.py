"""Storage quota routes: thin wrappers over control.storage_quota.StorageQuotaOps.

`PUT /v1/teams/{team}/storage-quota` (admins) sets a team's artifact storage quota in
bytes, `DELETE` (admins) removes it, `GET` answers it next to what the team's artifacts
keep (`used_bytes`); members and viewers read their own team's only (403 otherwise). An
upload that would take a team past its quota is refused by the artifact routes (413
naming the quota). Bad input is a 400 or 422 naming the field.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path, Request
from pydantic import Field, StrictInt

from aicluster.api.audit import note_target
from aicluster.api.bodies import Body
from aicluster.api.errors import BODY, responses
from aicluster.api.strict_json import StrictJSONRoute, finite
from aicluster.control.storage_quota import StorageQuotaOps
from aicluster.specs.limits import INT64_MAX
from aicluster.specs.names import NAME_PATTERN

TeamName = Path(pattern=NAME_PATTERN, max_length=63, description="a team")
ROUTE = "/v1/teams/{team}/storage-quota"


class StorageQuotaBody(Body):
    bytes: StrictInt = Field(
        ge=0, le=INT64_MAX, description="the most bytes the team's artifact versions may keep"
    )


def storage_quota_router(ops: StorageQuotaOps, principal) -> APIRouter:
    r = APIRouter(route_class=StrictJSONRoute)

    @r.get(ROUTE, responses=responses(400, 401, 403, 404, 422))
    def storage_quota(team: str = TeamName, who=Depends(principal)):
        return finite(ops.show(who, team))

    @r.put(ROUTE, responses=responses(401, 403, 404, *BODY))
    def set_storage_quota(
        request: Request, team: str = TeamName, *, body: StorageQuotaBody, who=Depends(principal)
    ):
        note_target(request, f"team={team}")
        return finite(ops.set(who, team, body.bytes))

    @r.delete(ROUTE, responses=responses(400, 401, 403, 404, 422))
    def clear_storage_quota(request: Request, team: str = TeamName, who=Depends(principal)):
        note_target(request, f"team={team}")
        return finite(ops.clear(who, team))

    return r
