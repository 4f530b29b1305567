"""Rate limit routes: thin wrappers over control.limits.LimitOps.

`PUT /v1/limits/teams/{team}` and `PUT /v1/limits/tokens/{token_id}` (admins) set a
team's or a token's limits: requests per second with a burst, tokens per minute (every
figure null: no limit); `GET /v1/limits` lists them (members: their team's and their own
tokens'). The gateways enforce them within about a second. Bad input is a 400 or 422
naming the field.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path, Request
from pydantic import Field

from aicluster.api.audit import note_target
from aicluster.api.bodies import Body
from aicluster.api.errors import BODY, responses
from aicluster.api.strict_json import StrictJSONRoute, finite
from aicluster.control.limits import LimitOps
from aicluster.specs.names import NAME_PATTERN


class LimitBody(Body):
    requests_per_s: float | None = Field(
        default=None, gt=0, le=1e6, description="requests per second; null: no limit"
    )
    burst: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="requests at once after a quiet spell (default: requests_per_s, rounded up)",
    )
    tokens_per_min: int | None = Field(
        default=None, ge=1, le=10**12, description="prompt + completion tokens a minute"
    )


def limits_router(ops: LimitOps, principal) -> APIRouter:
    r = APIRouter(route_class=StrictJSONRoute)

    @r.put("/v1/limits/teams/{team}", responses=responses(401, 403, 404, *BODY))
    def set_team_limit(
        request: Request,
        team: str = Path(pattern=NAME_PATTERN, max_length=63, description="a team"),
        *,
        body: LimitBody,
        who=Depends(principal),
    ):
        note_target(request, f"team={team}")
        return finite(ops.set_team(who, team, body.model_dump()))

    @r.put("/v1/limits/tokens/{token_id}", responses=responses(401, 403, 404, *BODY))
    def set_token_limit(
        request: Request,
        token_id: int = Path(ge=1, le=2**31 - 1, description="a token's id (tokens list)"),
        *,
        body: LimitBody,
        who=Depends(principal),
    ):
        note_target(request, f"token_id={token_id}")
        return finite(ops.set_token(who, token_id, body.model_dump()))

    @r.get("/v1/limits", responses=responses(401))
    def limits(who=Depends(principal)):
        return finite({"limits": ops.list(who)})

    return r
