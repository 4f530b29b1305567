"""Budget routes: thin wrappers over control.budgets.BudgetOps.

`PUT /v1/budgets/{team}` (admins) creates or changes a team's monthly budget and caps:
the fields given change, the others keep their values (a new budget needs `monthly_usd`);
`max_gpus` or `max_queued_jobs` null removes that cap. `DELETE /v1/budgets/{team}`
(admins) removes them. `GET /v1/budgets` lists each budget with what its team spent this
UTC month and its state (`ok`, `warned`, `over`); members and viewers see their team's.
Bad input is a 400 or 422 naming the field.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path
from pydantic import Field

from aicluster.api.bodies import Body
from aicluster.api.errors import BODY, responses
from aicluster.api.strict_json import StrictJSONRoute, finite
from aicluster.control.budgets import BudgetOps
from aicluster.specs.limits import INT64_MAX
from aicluster.specs.names import NAME_PATTERN

TeamName = Path(pattern=NAME_PATTERN, max_length=63, description="a team")


class BudgetBody(Body):
    """The fields to set; a field left out keeps its value (or its default, for a new
    budget: warn_at 0.8, enforce false, no caps)."""

    monthly_usd: float | None = Field(
        default=None, gt=0, le=1e12, description="USD a UTC calendar month (a new budget needs it)"
    )
    warn_at: float | None = Field(
        default=None, gt=0, le=1, description="the fraction of the budget that warns (Event)"
    )
    enforce: bool | None = Field(
        default=None, description="over budget, the team's new work waits (running work goes on)"
    )
    max_gpus: int | None = Field(
        default=None,
        ge=0,
        le=INT64_MAX,
        description="GPUs the team's workloads may hold at once, all pools together; null: no cap",
    )
    max_queued_jobs: int | None = Field(
        default=None,
        ge=0,
        le=INT64_MAX,
        description="pending jobs the team may have (a submit past it: 429); null: no cap",
    )


def budgets_router(ops: BudgetOps, principal) -> APIRouter:
    r = APIRouter(route_class=StrictJSONRoute)

    @r.get("/v1/budgets", responses=responses(401))
    def budgets(who=Depends(principal)):
        return finite({"budgets": ops.list_for(who)})

    @r.put("/v1/budgets/{team}", responses=responses(401, 403, 404, *BODY))
    def set_budget(team: str = TeamName, *, body: BudgetBody, who=Depends(principal)):
        given = body.model_dump(include=body.model_fields_set)
        return finite(ops.put(who, team, given))

    @r.delete("/v1/budgets/{team}", responses=responses(401, 403, 404, 422))
    def delete_budget(team: str = TeamName, who=Depends(principal)):
        return ops.delete(who, team)

    return r
