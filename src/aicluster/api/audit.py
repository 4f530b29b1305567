"""The one place that writes the audit log: a pure ASGI middleware around the whole API.

Audited: every call that may change something (POST, PUT, PATCH, DELETE), whoever makes
it and whatever the answer (401s, 403s and 4xx included), and the reads of the audit log
and of API tokens (AUDITED_READS). Not audited: the inference data plane (OpenAI and
Ollama routes: their use goes to the usage ledger) and every other read.

Invariants: the entry is committed before the response starts, so a client that has its
answer finds its entry; the caller is the one the route's authentication found (the
`principal` dependency leaves it in the request's state), none when it found none; the
entry names the route's template and the call's *target* (its path parameters, the
`team`/`user` query parameters, and what the route adds with `note_target`), never a
header, a request body, a token (store.audit masks any) or another query parameter.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import parse_qs

from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from aicluster.store.audit import AuditStore

log = logging.getLogger("aicluster.audit")

AUDITED_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
AUDITED_READS = frozenset({"/v1/audit", "/v1/tokens"})  # route templates
DATA_PLANE = re.compile(r"^/(v1/(chat/completions|completions|embeddings)|api/)")
TARGET_QUERY = ("team", "user")
PRINCIPAL = "principal"  # the request state's key for the authenticated caller
_TARGET = "audit_target"


def note_target(request: Request, text: str) -> None:
    """Add `text` (e.g. `user=alice`) to the target of this call's audit entry."""
    state = request.scope.setdefault("state", {})
    state[_TARGET] = f"{state[_TARGET]} {text}" if state.get(_TARGET) else text


def audited(method: str, path: str) -> bool:
    """Whether a call to `path` (a raw path or a route template) is audited."""
    if method == "GET":
        return path in AUDITED_READS
    return method in AUDITED_METHODS and not DATA_PLANE.match(path)


class AuditMiddleware:
    def __init__(self, app, audit: AuditStore):
        self.app = app
        self.audit = audit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not audited(scope["method"], scope["path"]):
            return await self.app(scope, receive, send)
        scope.setdefault("state", {})
        status = None

        async def send_audited(message):
            nonlocal status
            if message["type"] == "http.response.start" and status is None:
                status = message["status"]
                await run_in_threadpool(self._write, scope, status)
            await send(message)

        try:
            await self.app(scope, receive, send_audited)
        except BaseException:
            if status is None:  # no answer went out: the server answers 500
                await run_in_threadpool(self._write, scope, 500)
            raise

    def _write(self, scope, status: int) -> None:
        route = getattr(scope.get("route"), "path", None) or scope["path"]
        who = scope["state"].get(PRINCIPAL)
        client = scope.get("client")
        try:
            self.audit.append(
                method=scope["method"],
                route=route,
                status=status,
                user=getattr(who, "user", None),
                role=getattr(who, "role", None),
                team=getattr(who, "team", None),
                job_id=getattr(who, "job_id", None),
                target=_target(scope),
                source=client[0] if client else None,
            )
            self.audit.prune_due()
        except SQLAlchemyError:
            log.exception("could not write the audit entry of %s %s", scope["method"], route)


def _target(scope) -> str | None:
    parts = [f"{k}={v}" for k, v in (scope.get("path_params") or {}).items()]
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    parts += [f"{k}={query[k][0]}" for k in TARGET_QUERY if query.get(k)]
    if scope["state"].get(_TARGET):
        parts.append(scope["state"][_TARGET])
    return " ".join(parts) or None
