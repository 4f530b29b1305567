"""`GET /v1/tokens` (a user's tokens, never their secrets) and `POST /v1/tokens/{id}/revoke`:
thin wrappers over control.tokens.TokenOps. `POST /v1/tokens` (admins make tokens) is in
api.app, by ApiOps.create_token."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path, Query, Request

from aicluster.api.audit import note_target
from aicluster.api.errors import responses
from aicluster.api.paging import CURSOR, LIMIT, page_body
from aicluster.api.strict_json import StrictJSONRoute, finite
from aicluster.control.tokens import TokenOps
from aicluster.specs.limits import INT64_MAX


def tokens_router(ops: TokenOps, principal) -> APIRouter:
    r = APIRouter(route_class=StrictJSONRoute)

    @r.get("/v1/tokens", responses=responses(400, 401, 403, 404, 422))
    def tokens(
        user: str | None = Query(
            default=None, max_length=64, description="whose (default: yours; admins: anyone)"
        ),
        all: bool = Query(default=False, description="every user's (admins)"),
        limit: int = LIMIT,
        cursor: str | None = CURSOR,
        who=Depends(principal),
    ):
        """Tokens oldest first, a page at a time (api.paging)."""
        return finite(page_body("tokens", *ops.page(who, user, all, limit, cursor)))

    @r.post("/v1/tokens/{token_id}/revoke", responses=responses(401, 404, 422))
    def revoke(
        request: Request,
        token_id: int = Path(ge=1, le=INT64_MAX, description="a token's id (tokens list)"),
        who=Depends(principal),
    ):
        t = ops.revoke(who, token_id)
        note_target(request, f"user={t['user']}")
        return finite(t)

    return r
