"""`GET /v1/audit`: the audit log (admins only), a thin wrapper over control.audit.AuditOps.

Entries come oldest first, after the id cursor `after`, at most `limit` of them; `next`
is the id cursor of the following page, `next_cursor` the same as the opaque cursor every
list route takes (api.paging; `cursor` and `after` may both be given: the later wins). Bad input is a 400 or 422 naming the field.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query

from aicluster.api.errors import responses
from aicluster.api.paging import CURSOR
from aicluster.api.strict_json import StrictJSONRoute, finite
from aicluster.control.audit import AuditOps
from aicluster.specs.limits import INT64_MAX
from aicluster.store.cursors import decode, encode


def audit_router(ops: AuditOps, principal) -> APIRouter:
    r = APIRouter(route_class=StrictJSONRoute)

    @r.get("/v1/audit", responses=responses(400, 401, 403, 422))
    def audit(
        since: str | None = Query(
            default=None,
            max_length=64,
            description="entries since: 1d, 12h, 30m, 90s, 2w ago or an ISO 8601 time; "
            "default: every entry kept",
        ),
        user: str | None = Query(default=None, max_length=64, description="one user's calls"),
        after: int = Query(default=0, ge=0, le=INT64_MAX, description="an entry id: page on"),
        limit: int = Query(default=500, ge=1, le=5000),
        cursor: str | None = CURSOR,
        who=Depends(principal),
    ):
        (last,) = decode(cursor, "audit", int) or (0,)
        page = ops.entries(who, since, user, max(after, last), limit)
        page["next_cursor"] = encode("audit", page["next"]) if page["next"] else None
        return finite(page)

    return r
