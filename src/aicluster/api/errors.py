"""Every error the API answers, in one shape: `{"detail": {"message": ..., "field": ...}}`.

Invariants: a client error is a 4xx whose message names the field at fault where there is
one; the handlers never echo the request's input back (it may be huge or nested deep);
the OpenAPI document declares, for each route, the error statuses it can answer, with
this body (`responses(...)`).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from aicluster.specs.errors import SpecError


class ErrorIssue(BaseModel):
    field: str
    message: str
    line: int | None = None


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="allow")
    message: str
    field: str | None = None
    issues: list[ErrorIssue] | None = None


class ErrorBody(BaseModel):
    detail: ErrorDetail


DESCRIPTIONS = {
    400: "Bad request: the body cannot be parsed (nested too deeply, not UTF-8) or a value "
    "is refused; `field` names it",
    401: "Missing or invalid API token",
    403: "The token's role may not do this",
    404: "No such object, or one of another team",
    409: "Conflicts with an existing object, or a name matches more than one (a job name "
    "an admin uses, of several teams: use the id or TEAM:NAME)",
    410: "Gone: deleted by a retention policy (a job's logs, past the logs retention)",
    413: "Request body larger than this route accepts",
    422: "Invalid input; `field` and `issues` name the fields",
    429: "Too many: the team has as many pending jobs as its cap allows; `field` names the "
    "cap (max_queued_jobs)",
    503: "A backing service is unavailable",
}

BODY = (400, 413, 422)  # every route that reads a JSON body can answer these


def responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a route: the error statuses it answers, with the error body."""
    return {c: {"model": ErrorBody, "description": DESCRIPTIONS[c]} for c in sorted(set(codes))}


def error(status: int, message: str, **extra) -> JSONResponse:
    return JSONResponse({"detail": {"message": message, **extra}}, status_code=status)


def _field_of(loc: tuple) -> tuple[str, str]:
    """(where, field) from a pydantic location such as ('body', 'spec') or ('query', 'after')."""
    where = str(loc[0]) if loc else "body"
    rest = [str(p) for p in loc[1:] if not isinstance(p, int) or len(loc) > 2]
    return where, ".".join(rest) or f"({where})"


async def _validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
    issues = []
    for err in exc.errors():
        where, field = _field_of(tuple(err.get("loc", ())))
        msg = str(err.get("msg", "invalid"))
        if err.get("type") == "json_invalid":
            msg = f"invalid JSON: {(err.get('ctx') or {}).get('error', msg)}"
        issues.append({"field": field, "in": where, "message": msg[:500]})
    first = issues[0] if issues else {"field": "(body)", "message": "invalid request"}
    message = "; ".join(f"{i['field']}: {i['message']}" for i in issues[:5]) or "invalid request"
    return error(422, message, field=first["field"], issues=issues[:50])


async def _spec_error(_req: Request, exc: SpecError) -> JSONResponse:
    issues = exc.to_dict()["issues"]
    return error(422, str(exc), field=issues[0]["field"] if issues else None, issues=issues)


async def _http(_req: Request, exc: StarletteHTTPException) -> JSONResponse:
    if isinstance(exc.detail, dict) and "message" in exc.detail:
        body = exc.detail
    else:
        body = {"message": str(exc.detail)}
    return JSONResponse({"detail": body}, status_code=exc.status_code, headers=exc.headers)


def _handler(status: int):
    async def handle(_req: Request, exc: Exception) -> JSONResponse:
        field = getattr(exc, "field", None)
        extra = {"field": field} if field else {}
        return error(status, str(exc).strip("'\""), **extra)

    return handle


async def _store_down(_req: Request, _exc: Exception) -> JSONResponse:
    """The state store's connection failed (a database restarting, a network cut): the
    request did nothing that was committed, so the client may retry it (on any replica)."""
    response = error(503, "the state store is unavailable; retry shortly")
    response.headers["Retry-After"] = "1"
    return response


def install_error_handlers(app: FastAPI, mapping: dict[type[Exception], int]) -> None:
    app.add_exception_handler(OperationalError, _store_down)
    app.add_exception_handler(InterfaceError, _store_down)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(SpecError, _spec_error)
    for exc_type, status in mapping.items():
        app.add_exception_handler(exc_type, _handler(status))
