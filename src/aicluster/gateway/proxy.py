"""Gateway: resolve the service, pick replicas with its routing policy, proxy the stream.

Invariants:
- The endpoint table is read from memory (pushed by the service loop), never the store.
- A request is retried on the next candidate only when its replica failed before the
  first response byte (connection error or 5xx); once bytes flow they pass through
  unbuffered, and the client sees exactly what the replica sent.
- A service with no READY replica holds the request (up to `hold_timeout_s`) while
  one starts, which is how scale-from-zero works. A held request that gives up (504)
  or whose service goes away (503) answers in OpenAI's format; either way it leaves the
  service's in-flight and held counts as they were before it came.
- Every proxied request carries the replica's secret (runtime.replica_auth); a replica
  that refuses it (401/403) counts as failed and the next candidate is tried.
- Every error the client sees is in OpenAI's format: the gateway's own, and an engine's
  4xx (whatever its shape) with the engine's status.
- `model` is `NAME` (the caller's team) or `TEAM/NAME`; the engine gets the model name
  it serves, never the caller's spelling.
- Bodies are bounded (`MAX_BODY_BYTES`) before parsing; JSON nested too deeply is a 400.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask

from aicluster.control.endpoints import EndpointTable, ServiceEndpoints
from aicluster.core.routing import ReplicaState, RouteRequest, RoutingPolicy, make_policy
from aicluster.gateway import errors
from aicluster.gateway.schemas import ERROR_RESPONSES, openapi_extra
from aicluster.runtime.replica_auth import SECRET_HEADER
from aicluster.specs.limits import MAX_OPENAI_BODY_BYTES

MAX_ATTEMPTS = 3
MAX_BODY_BYTES = MAX_OPENAI_BODY_BYTES  # the API's limit too: one bound, wherever it runs
MAX_ERROR_BYTES = 1 << 20  # of an engine's error answer, read to translate it
ROUTES = ("completions", "chat/completions", "embeddings")


def prompt_of(body: dict) -> str:
    if "messages" in body and isinstance(body["messages"], list):
        parts = [m.get("content") for m in body["messages"] if isinstance(m, dict)]
        return "\n".join(p for p in parts if isinstance(p, str))
    prompt = body.get("prompt", body.get("input", ""))
    if isinstance(prompt, list):
        return "\n".join(p for p in prompt if isinstance(p, str))
    return prompt if isinstance(prompt, str) else ""


class Gateway:
    def __init__(
        self,
        table: EndpointTable,
        authenticate: Callable,
        clock=time.time,
        hold_timeout_s: float = 120.0,
        metrics=None,
    ):
        self.table, self.authenticate, self.clock = table, authenticate, clock
        self.metrics = metrics  # control.metrics.Metrics, or None
        self.hold_timeout_s = hold_timeout_s
        self._policies: dict[tuple[str, str], tuple[tuple, RoutingPolicy]] = {}
        self._client: httpx.AsyncClient | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
            timeout = httpx.Timeout(connect=2.0, read=None, write=30.0, pool=30.0)
            self._client = httpx.AsyncClient(limits=limits, timeout=timeout)
        return self._client

    def policy(self, ep: ServiceEndpoints) -> RoutingPolicy:
        key = (ep.team, ep.name)
        sig = (ep.routing, tuple(sorted(ep.routing_options.items())))
        cached = self._policies.get(key)
        if cached is None or cached[0] != sig:
            cached = (sig, make_policy(ep.routing, **ep.routing_options))
            self._policies[key] = cached
        policy = cached[1]
        for rid in set(policy._outstanding) - {r.replica_id for r in ep.replicas}:
            policy.forget(rid)
        return policy

    def router(self) -> APIRouter:
        r = APIRouter()

        @r.get("/v1/models", responses={401: ERROR_RESPONSES[401]})
        async def models(request: Request):
            who = self._who(request)
            if who is None:
                return errors.unauthorized()
            home = who.team or "default"
            data = [
                {
                    "id": ep.name if ep.team == home else f"{ep.team}/{ep.name}",
                    "object": "model",
                    "created": 0,
                    "owned_by": ep.team,
                }
                for ep in self.table.all()
                if who.is_admin or ep.team == who.team
            ]
            return {"object": "list", "data": data}

        for path in ROUTES:
            r.add_api_route(
                f"/v1/{path}",
                self._handler(path),
                methods=["POST"],
                openapi_extra=openapi_extra(path),
                responses=ERROR_RESPONSES,
                summary=f"OpenAI {path.replace('/', ' ')} through a service's replicas",
            )
        return r

    def _who(self, request: Request):
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return None
        return self.authenticate(token.strip())

    def _resolve(self, who, model: str) -> ServiceEndpoints | None:
        """`name` is a service of the caller's team (admins: of `default`);
        `team/name` names a service of that team: the caller's own, or any for admins."""
        team, _, name = model.rpartition("/")
        home = who.team or "default"
        if team and team != home and not who.is_admin:
            return None
        return self.table.get(team or home, name)

    def _handler(self, path: str):
        async def handle(request: Request):
            who = self._who(request)
            if who is None:
                return errors.unauthorized()
            raw = await _read_bounded(request, MAX_BODY_BYTES)
            if raw is None:
                return errors.too_large(MAX_BODY_BYTES)
            try:
                body = json.loads(raw)
            except RecursionError:
                return errors.bad_request("the request body nests JSON too deeply")
            except ValueError:
                return errors.bad_request("the request body is not valid JSON")
            if not isinstance(body, dict) or not isinstance(body.get("model"), str):
                return errors.bad_request("'model' is required", "model")
            ep = self._resolve(who, body["model"])
            if ep is None:
                return errors.model_not_found(body["model"])
            served = ep.served_model or ep.name
            if body["model"] != served:  # `team/name`, or an engine with its own model id
                body["model"] = served
                try:
                    raw = json.dumps(body).encode()
                except RecursionError:
                    return errors.bad_request("the request body nests JSON too deeply")
            return await self._forward(ep, path, raw, body, request)

        return handle

    async def _forward(
        self, ep: ServiceEndpoints, path: str, raw: bytes, body: dict, request: Request
    ):
        team, name = ep.team, ep.name
        held = not ep.replicas
        self.table.request_started(team, name, self.clock(), held=held)
        passed_on = False  # the stream's end will count the request finished
        held_at = self.clock() if held else None
        try:
            if held:
                ep, refusal = await self._wait_for_replicas(team, name)  # releases the hold
                if ep is None:
                    return refusal
            resp = await self._try_replicas(ep, path, raw, body, request)
            if held_at is not None:  # scale from zero: say how long the cold start took
                resp.headers["x-aicluster-cold-start-ms"] = f"{(self.clock() - held_at) * 1e3:.0f}"
            if isinstance(resp, StreamingResponse):
                prev = resp.background
                resp.background = BackgroundTask(self._finish, ep, prev)
                passed_on = True
            return resp
        finally:
            if not passed_on:
                self.table.request_finished(team, name)

    async def _finish(self, ep: ServiceEndpoints, inner: BackgroundTask | None) -> None:
        try:
            if inner is not None:
                await inner()
        finally:
            self.table.request_finished(ep.team, ep.name)

    async def _wait_for_replicas(self, team: str, name: str):
        """(endpoints with a replica, None), or (None, the answer) when the hold time
        passes (504) or the service goes away (503). Releases the hold either way."""
        deadline = self.clock() + self.hold_timeout_s
        try:
            while True:
                ep = self.table.get(team, name)
                if ep is None:
                    return None, errors.unavailable(
                        f"service '{name}' was deleted while the request waited for a replica"
                    )
                if ep.replicas:
                    return ep, None
                if self.clock() > deadline:
                    return None, errors.timed_out(
                        f"no replica of '{name}' became ready within {self.hold_timeout_s:g} s"
                    )
                await asyncio.sleep(0.05)
        finally:
            self.table.unheld(team, name)

    async def _try_replicas(self, ep, path, raw, body, request):
        policy = self.policy(ep)
        route = RouteRequest(
            now=self.clock(),
            prompt=prompt_of(body),
            user=body.get("user"),
            headers={k.lower(): v for k, v in request.headers.items()},
        )
        reps = {r.replica_id: r for r in ep.replicas}
        candidates = policy.choose_replicas(route, [ReplicaState(rid) for rid in reps])
        content_type = request.headers.get("content-type", "application/json")
        last_error = "no healthy replica"
        started = self.clock()
        for rid in candidates[:MAX_ATTEMPTS]:
            policy.on_start(rid, route)
            headers = {"content-type": content_type, SECRET_HEADER: reps[rid].secret}
            try:
                upstream = await self.client.send(
                    self.client.build_request(
                        "POST", f"{reps[rid].url}/v1/{path}", content=raw, headers=headers
                    ),
                    stream=True,
                )
            except httpx.HTTPError as exc:
                policy.on_finish(rid)
                policy.on_result(rid, False, self.clock())
                last_error = f"replica {rid}: {type(exc).__name__}"
                self._count(ep, rid, "connect_error")
                continue
            status = upstream.status_code
            if status >= 500 or status in (401, 403):  # 401/403: it refused our secret
                await upstream.aclose()
                policy.on_finish(rid)
                policy.on_result(rid, False, self.clock())
                last_error = f"replica {rid} answered {status}"
                self._count(ep, rid, str(status))
                continue
            policy.on_result(rid, True, self.clock())
            self._count(ep, rid, str(status))
            if status >= 400:  # the engine refused the request: say so in OpenAI's format
                try:
                    raw_error = await _read_upstream(upstream, MAX_ERROR_BYTES)
                except httpx.HTTPError:
                    raw_error = b""
                finally:
                    await upstream.aclose()
                    policy.on_finish(rid)
                self._observe_end(ep, started)
                return errors.from_upstream(status, raw_error)
            return _passthrough(
                upstream,
                on_first=lambda rid=rid: self._observe_ttfb(ep, rid, started),
                on_done=lambda rid=rid: (policy.on_finish(rid), self._observe_end(ep, started)),
            )
        return errors.unavailable(f"all replicas failed: {last_error}")

    def _count(self, ep: ServiceEndpoints, rid: str, code: str) -> None:
        if self.metrics is not None:
            self.metrics.gateway_requests.labels(ep.team, ep.name, rid, code).inc()

    def _observe_ttfb(self, ep: ServiceEndpoints, rid: str, started: float) -> None:
        if self.metrics is not None:
            self.metrics.gateway_ttfb.labels(ep.team, ep.name, rid).observe(self.clock() - started)

    def _observe_end(self, ep: ServiceEndpoints, started: float) -> None:
        if self.metrics is not None:
            self.metrics.gateway_latency.labels(ep.team, ep.name).observe(self.clock() - started)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()


async def _read_bounded(request: Request, limit: int) -> bytes | None:
    """The body, or None when it is longer than `limit` (read no further than that)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def _read_upstream(upstream: httpx.Response, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in upstream.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size >= limit:
            break
    return b"".join(chunks)[:limit]


class _ProxiedStream(StreamingResponse):
    """Runs its background task (closing the upstream, counting the request finished)
    however the stream ends: Starlette skips it when the body raises, as it does when
    the replica breaks the stream after the first byte."""

    async def __call__(self, scope, receive, send) -> None:
        background, self.background = self.background, None
        try:
            await super().__call__(scope, receive, send)
        finally:
            if background is not None:
                await background()


def _passthrough(
    upstream: httpx.Response, on_first: Callable[[], None], on_done: Callable[[], None]
) -> StreamingResponse:
    async def body():
        first = True
        async for chunk in upstream.aiter_raw():
            if first and chunk:
                first = False
                on_first()
            yield chunk

    async def close():
        await upstream.aclose()
        on_done()

    keep = {
        k: v
        for k, v in upstream.headers.items()
        if k.lower() in ("content-type", "content-encoding", "cache-control", "x-request-id")
    }
    return _ProxiedStream(
        body(), status_code=upstream.status_code, headers=keep, background=BackgroundTask(close)
    )


__all__ = ["Gateway", "JSONResponse"]
