"""Gateway: resolve the service, pick replicas with its routing policy, proxy the stream.

Invariants:
- The endpoint table is read from memory (pushed by the service loop), never the store.
- A request is retried on the next candidate only when its replica failed before the
  first response byte (connection error or 5xx); once bytes flow they pass through
  unbuffered, and the client sees exactly what the replica sent.
- A service with no READY replica holds the request (up to its routing option
  `hold_timeout_s`, else the gateway's) while one starts, which is how scale-from-zero
  works. A held request that gives up or whose service goes away gets a 503 in OpenAI's
  format (with Retry-After when it timed out); either way it leaves the service's
  in-flight and held counts as they were before it came, so scale-to-zero still happens.
- Every request counted in flight (`EndpointTable.request_started`) is counted finished
  exactly once: when its answer is an error, or when the stream `Opened.close` closes ends.
- Every proxied request carries the replica's secret (runtime.replica_auth); a replica
  that refuses it (401/403) counts as failed and the next candidate is tried.
- Every error the client sees is in OpenAI's format: the gateway's own, and an engine's
  4xx (whatever its shape) with the engine's status.
- `model` is `NAME` (the caller's team) or `TEAM/NAME`; the engine gets the model name
  it serves, never the caller's spelling (`gateway.bodies`: only the model's bytes change).
- Routing sees each replica's own load as last scraped from its `/metrics`
  (`gateway.load`) next to this gateway's outstanding counts.
- Bodies are bounded (`MAX_BODY_BYTES`) before parsing; JSON nested too deeply is a 400.
- A refused token's 401 says why when the token is known: expired or revoked, and when.
- Rate limits (`gateway.ratelimit`) are checked after authentication, before the body is
  read: a request over one gets a 429 with Retry-After. Every request that reached a
  service is recorded once its answer completes (`gateway.usage`), from memory only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from aicluster.control.endpoints import EndpointTable, ServiceEndpoints
from aicluster.core.routing import RouteRequest, RoutingPolicy, make_policy
from aicluster.gateway import errors
from aicluster.gateway.bodies import BodyError, parse
from aicluster.gateway.load import LoadScraper
from aicluster.gateway.ollama import OllamaRoutes
from aicluster.gateway.ratelimit import Limiter
from aicluster.gateway.schemas import ERROR_RESPONSES, openapi_extra
from aicluster.gateway.streams import Opened, passthrough, read_bounded, read_upstream
from aicluster.gateway.upstream import Pool, ReplicaError
from aicluster.gateway.usage import UsageRecorder, meter_for
from aicluster.runtime.replica_auth import SECRET_HEADER
from aicluster.specs.limits import MAX_OPENAI_BODY_BYTES
from aicluster.store.identity import Principal

MAX_ATTEMPTS = 3
MAX_BODY_BYTES = MAX_OPENAI_BODY_BYTES  # the API's limit too: one bound, wherever it runs
MAX_ERROR_BYTES = 1 << 20  # of an engine's error answer, read to translate it
ROUTES = ("completions", "chat/completions", "embeddings")
HOLD_POLL_S = 0.05
RETRY_AFTER_S = 5  # what a held request that timed out is told


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
        scrape_interval_s: float | None = 1.0,
        usage: UsageRecorder | None = None,
        limiter: Limiter | None = None,
    ):
        self.table, self.authenticate, self.clock = table, authenticate, clock
        self.usage, self.limiter = usage, limiter
        self.metrics = metrics  # control.metrics.Metrics, or None
        self.hold_timeout_s = hold_timeout_s
        self._policies: dict[tuple[str, str], tuple[tuple, RoutingPolicy]] = {}
        self._client: httpx.AsyncClient | None = None  # for scraping replicas' /metrics
        self.pool = Pool()  # for proxying: gateway.upstream (lean keep-alive connections)
        self.loads = LoadScraper(
            table, lambda: self.client, self._own_outstanding, interval_s=scrape_interval_s
        )

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
            timeout = httpx.Timeout(connect=2.0, read=None, write=30.0, pool=30.0)
            self._client = httpx.AsyncClient(limits=limits, timeout=timeout)
        return self._client

    def policy(self, ep: ServiceEndpoints) -> RoutingPolicy:
        """The service's policy (ValueError when its routing options are invalid)."""
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

    def _own_outstanding(self, team: str, name: str, replica_id: str) -> int:
        cached = self._policies.get((team, name))
        return cached[1].outstanding(replica_id) if cached else 0

    def router(self) -> APIRouter:
        r = APIRouter()

        @r.get("/v1/models", responses={401: ERROR_RESPONSES[401]})
        async def models(request: Request):
            who = self.who(request.headers)
            if not isinstance(who, Principal):
                return errors.unauthorized(who)
            home = who.team or "default"
            data = [
                {
                    "id": ep.name if ep.team == home else f"{ep.team}/{ep.name}",
                    "object": "model",
                    "created": 0,
                    "owned_by": ep.team,
                }
                for ep in self.visible(who)
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
        r.include_router(OllamaRoutes(self).router())
        return r

    def who(self, headers: Mapping[str, str]):
        """The caller of a request with these headers (a bearer token): a Principal; a
        Refusal (store.identity) for a known token that no longer works; else None."""
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return None
        return self.authenticate(token.strip())

    def visible(self, who) -> list[ServiceEndpoints]:
        return [ep for ep in self.table.all() if who.is_admin or ep.team == who.team]

    def resolve(self, who, model: str) -> ServiceEndpoints | None:
        """`name` is a service of the caller's team (admins: of `default`);
        `team/name` names a service of that team: the caller's own, or any for admins."""
        team, _, name = model.rpartition("/")
        home = who.team or "default"
        if team and team != home and not who.is_admin:
            return None
        return self.table.get(team or home, name)

    def _handler(self, path: str):
        async def handle(request: Request):
            out = await self.forward(path, request.headers, lambda n: read_bounded(request, n))
            if isinstance(out, tuple):
                return passthrough(*out)
            return out

        return handle

    async def forward(
        self,
        path: str,
        headers: Mapping[str, str],
        read_body: Callable[[int], Awaitable[bytes | None]],
    ) -> tuple[Opened, Callable[[bytes], None]] | JSONResponse:
        """One OpenAI request, whatever server carries it (`headers` with lower-case names,
        `read_body(limit)`: the body, or None past the limit): the gateway's error, or the
        replica's opened answer and what each of its chunks must be shown to as it passes
        (the usage meter). The caller passes the chunks on and closes the Opened."""
        who = self.who(headers)
        if not isinstance(who, Principal):
            return errors.unauthorized(who)
        refused = self.over_limit(who)
        if refused is not None:
            return errors.rate_limited(refused)
        raw = await read_body(MAX_BODY_BYTES)
        if raw is None:
            return errors.too_large(MAX_BODY_BYTES)
        try:
            body = parse(raw)
        except BodyError as exc:
            return errors.bad_request(str(exc))
        if body.model is None:
            return errors.bad_request("'model' is required (a string)", "model")
        ep = self.resolve(who, body.model)
        if ep is None:
            return errors.model_not_found(body.model)
        raw = body.with_model(ep.served_model or ep.name)
        out_headers = {"content-type": headers.get("content-type", "application/json")}
        opened = await self.open(ep, path, raw, body.doc, headers, out_headers)
        if not isinstance(opened, Opened):
            self.record(who, ep, 0, 0, error=True)
            return opened
        meter = meter_for(opened.upstream.headers)
        self.on_close(opened, lambda: self.record(who, ep, *meter.tokens()))
        return opened, meter.feed

    def over_limit(self, who: Principal):
        """The refusal (gateway.ratelimit.Refused) when `who` is over a rate limit; such a
        request is recorded as limited (usage) and counted with code 429 (metrics)."""
        refused = self.limiter.admit(who) if self.limiter is not None else None
        if refused is not None:
            if self.usage is not None:
                self.usage.record(who, "", "", 0, 0, limited=True)
            if self.metrics is not None:
                self.metrics.gateway_requests.labels(who.team or "", "", "", "429").inc()
        return refused

    def record(
        self,
        who: Principal,
        ep: ServiceEndpoints,
        prompt: int,
        completion: int,
        error: bool = False,
    ) -> None:
        """A request to `ep` completed: its usage recorded, its tokens charged to the
        caller's tokens-per-minute buckets (memory only)."""
        if self.usage is not None:
            model = ep.served_model or ep.name
            self.usage.record(who, f"{ep.team}/{ep.name}", model, prompt, completion, error)
        if self.limiter is not None:
            self.limiter.charge(who, prompt + completion)

    @staticmethod
    def on_close(opened: Opened, then: Callable[[], object]) -> None:
        """Run `then` after the request is counted finished (whatever else on_done does)."""
        inner = opened.on_done
        opened.on_done = lambda: _then(inner, then)

    async def open(
        self,
        ep: ServiceEndpoints,
        path: str,
        raw: bytes,
        body: dict,
        client_headers: Mapping[str, str],
        headers: dict[str, str],
    ) -> Opened | JSONResponse:
        """POST `raw` to `/v1/{path}` of one of the service's replicas (holding the request
        while it has none): the replica's answer, or the gateway's error in OpenAI's format.
        The request counts in flight until the error is returned or `Opened.close` runs."""
        team, name = ep.team, ep.name
        held = not ep.replicas
        self.table.request_started(team, name, self.clock(), held=held)
        passed_on = False  # the Opened's close will count the request finished
        held_at = self.clock() if held else None
        try:
            try:
                policy = self.policy(ep)
            except ValueError as exc:  # deploy checks them: a service stored before that
                if held:
                    self.table.unheld(team, name)
                return errors.unavailable(f"the routing options of '{name}' are invalid: {exc}")
            if held:
                ep, refusal = await self._wait_for_replicas(team, name, policy)
                if ep is None:
                    return refusal
                try:
                    policy = self.policy(ep)  # its options may have changed meanwhile
                except ValueError as exc:
                    return errors.unavailable(f"the routing options of '{name}' are invalid: {exc}")
            out = await self._try_replicas(ep, policy, path, raw, body, client_headers, headers)
            if isinstance(out, Opened):
                if held_at is not None:  # scale from zero: say how long the cold start took
                    out.cold_start_ms = (self.clock() - held_at) * 1e3
                inner = out.on_done
                out.on_done = lambda: _then(inner, lambda: self.table.request_finished(team, name))
                passed_on = True
            return out
        finally:
            if not passed_on:
                self.table.request_finished(team, name)

    async def _wait_for_replicas(self, team: str, name: str, policy: RoutingPolicy):
        """(endpoints with a replica, None), or (None, a 503) when the hold time passes
        or the service goes away. Releases the hold either way."""
        hold_s = policy.options.hold_timeout_s or self.hold_timeout_s
        deadline = self.clock() + hold_s
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
                        f"no replica of '{name}' became ready within {hold_s:g} s",
                        RETRY_AFTER_S,
                    )
                await asyncio.sleep(HOLD_POLL_S)
        finally:
            self.table.unheld(team, name)

    async def _try_replicas(self, ep, policy, path, raw, body, client_headers, headers):
        route = RouteRequest(
            now=self.clock(),
            prompt=prompt_of(body),
            user=body.get("user") if isinstance(body.get("user"), str) else None,
            headers=_lower(client_headers),
        )
        reps = {r.replica_id: r for r in ep.replicas}
        candidates = policy.choose_replicas(route, self.loads.states(ep))
        last_error = "no healthy replica"
        started = self.clock()
        for rid in candidates[:MAX_ATTEMPTS]:
            policy.on_start(rid, route)
            try:
                upstream = await self.pool.request(
                    "POST",
                    f"{reps[rid].url}/v1/{path}",
                    raw,
                    {**headers, SECRET_HEADER: reps[rid].secret},
                )
            except ReplicaError as exc:
                policy.on_finish(rid)
                policy.on_result(rid, False, self.clock())
                last_error = f"replica {rid}: {exc}"
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
                    raw_error = await read_upstream(upstream, MAX_ERROR_BYTES)
                except ReplicaError:
                    raw_error = b""
                finally:
                    await upstream.aclose()
                    policy.on_finish(rid)
                self._observe_end(ep, started)
                return errors.from_upstream(status, raw_error)
            return Opened(
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
        await self.loads.stop()
        await self.pool.aclose()
        if self._client is not None:
            await self._client.aclose()


def _then(first: Callable[[], object], second: Callable[[], object]) -> None:
    try:
        first()
    finally:
        second()


def _lower(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


__all__ = ["Gateway"]
