"""Gateway: resolve the service, pick replicas with its routing policy, proxy the stream.

Invariants:
- The endpoint table is read from memory (pushed by the service loop), never the store.
- A request is retried on the next candidate only when its replica failed before the
  first response byte (connection error or 5xx); once bytes flow they pass through
  unbuffered, and the client sees exactly what the replica sent.
- A service with no READY replica holds the request (up to `hold_timeout_s`) while
  one starts, which is how scale-from-zero works.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Callable

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask

from aicluster.control.endpoints import EndpointTable, ServiceEndpoints
from aicluster.core.routing import ReplicaState, RouteRequest, RoutingPolicy, make_policy
from aicluster.gateway import errors

MAX_ATTEMPTS = 3
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
        self, table: EndpointTable, authenticate: Callable, clock=time.time,
        hold_timeout_s: float = 120.0, metrics=None,
    ):  # fmt: skip
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

        @r.get("/v1/models")
        async def models(request: Request):
            who = self._who(request)
            if who is None:
                return errors.unauthorized()
            home = who.team or "default"
            data = [
                {"id": ep.name if ep.team == home else f"{ep.team}/{ep.name}",
                 "object": "model", "created": 0, "owned_by": ep.team}
                for ep in self.table.all() if who.is_admin or ep.team == who.team
            ]  # fmt: skip
            return {"object": "list", "data": data}

        for path in ROUTES:
            r.add_api_route(f"/v1/{path}", self._handler(path), methods=["POST"])
        return r

    def _who(self, request: Request):
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return None
        return self.authenticate(token.strip())

    def _resolve(self, who, model: str) -> ServiceEndpoints | None:
        """`name` is a service of the caller's team (admins: of `default`);
        `team/name` names another team's service, which only admins may use."""
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
            raw = await request.body()
            try:
                body = json.loads(raw)
            except ValueError:
                return errors.bad_request("the request body is not valid JSON")
            if not isinstance(body, dict) or not isinstance(body.get("model"), str):
                return errors.bad_request("'model' is required", "model")
            ep = self._resolve(who, body["model"])
            if ep is None:
                return errors.model_not_found(body["model"])
            return await self._forward(ep, path, raw, body, request)

        return handle

    async def _forward(self, ep: ServiceEndpoints, path: str, raw: bytes, body: dict,
                       request: Request):  # fmt: skip
        self.table.request_started(ep.team, ep.name, self.clock(), held=not ep.replicas)
        done = False
        held_at = self.clock() if not ep.replicas else None
        try:
            ep = await self._wait_for_replicas(ep)
            if ep is None:
                return errors.unavailable("no replica became ready in time")
            resp = await self._try_replicas(ep, path, raw, body, request)
            if held_at is not None:  # scale from zero: say how long the cold start took
                resp.headers["x-aicluster-cold-start-ms"] = f"{(self.clock() - held_at) * 1e3:.0f}"
            if isinstance(resp, StreamingResponse):
                prev = resp.background
                resp.background = BackgroundTask(self._finish, ep, prev)
                done = True
            return resp
        finally:
            if not done:
                self.table.request_finished(ep.team, ep.name)

    async def _finish(self, ep: ServiceEndpoints, inner: BackgroundTask | None) -> None:
        try:
            if inner is not None:
                await inner()
        finally:
            self.table.request_finished(ep.team, ep.name)

    async def _wait_for_replicas(self, ep: ServiceEndpoints) -> ServiceEndpoints | None:
        deadline = self.clock() + self.hold_timeout_s
        while not ep.replicas:
            if self.clock() > deadline:
                return None
            await asyncio.sleep(0.05)
            fresh = self.table.get(ep.team, ep.name)
            if fresh is None:
                return None
            ep = fresh
        self.table.unheld(ep.team, ep.name)
        return ep

    async def _try_replicas(self, ep, path, raw, body, request):
        policy = self.policy(ep)
        route = RouteRequest(now=self.clock(), prompt=prompt_of(body), user=body.get("user"),
                             headers={k.lower(): v for k, v in request.headers.items()})  # fmt: skip
        urls = {r.replica_id: r.url for r in ep.replicas}
        candidates = policy.choose_replicas(route, [ReplicaState(rid) for rid in urls])
        headers = {"content-type": request.headers.get("content-type", "application/json")}
        last_error = "no healthy replica"
        started = self.clock()
        for rid in candidates[:MAX_ATTEMPTS]:
            policy.on_start(rid, route)
            try:
                upstream = await self.client.send(
                    self.client.build_request("POST", f"{urls[rid]}/v1/{path}", content=raw,
                                              headers=headers),  # fmt: skip
                    stream=True,
                )
            except httpx.HTTPError as exc:
                policy.on_finish(rid)
                policy.on_result(rid, False, self.clock())
                last_error = f"replica {rid}: {type(exc).__name__}"
                self._count(ep, rid, "connect_error")
                continue
            if upstream.status_code >= 500:
                await upstream.aclose()
                policy.on_finish(rid)
                policy.on_result(rid, False, self.clock())
                last_error = f"replica {rid} answered {upstream.status_code}"
                self._count(ep, rid, str(upstream.status_code))
                continue
            policy.on_result(rid, True, self.clock())
            self._count(ep, rid, str(upstream.status_code))
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


def _passthrough(upstream: httpx.Response, on_first: Callable[[], None],
                 on_done: Callable[[], None]) -> StreamingResponse:  # fmt: skip
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

    keep = {k: v for k, v in upstream.headers.items()
            if k.lower() in ("content-type", "content-encoding", "cache-control", "x-request-id")}  # fmt: skip
    return StreamingResponse(body(), status_code=upstream.status_code,
                             headers=keep, background=BackgroundTask(close))  # fmt: skip


__all__ = ["Gateway", "JSONResponse"]
