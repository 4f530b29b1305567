"""The simulated LLM engine as a server: OpenAI-compatible routes and vLLM-style metrics.

Serves `/v1/models`, `/v1/completions`, `/v1/chat/completions` (`stream: true` gives
server-sent events in OpenAI's chunk format, ending with `data: [DONE]`), `/health`,
`/metrics` (Prometheus text, vLLM's metric names with a `model_name` label), and the
probes that peer routers make (`/version`, `/health_generate`, `/server_info`,
`/get_server_info`, `/model_info`, `/get_model_info`, `/loads`, `/tokenize`).

Vocabulary: simulated time = (clock() - start) / time_scale. Each request is planned by
`EngineModel` when it arrives; the server then waits, in wall time, until each token's
planned time. Reported latencies (the TTFT histogram, e2e latency) are the plan's
simulated seconds, not measured ones, so they are deterministic for a given arrival
sequence. `usage.prompt_tokens_details.cached_tokens` reports the prefix cache hit.

Run: `python -m aicluster.runtime.simulated_engine --host 127.0.0.1 --port 8001
[--block-size 16 --max-concurrency 64 ...]` (every `SimulatedEngineOptions` field).
When AICLUSTER_REPLICA_SECRET is set (a replica), every route needs it in the
X-Aicluster-Replica-Secret header (runtime.replica_auth). With `--startup-s S` it loads
for S wall seconds first, as an engine loading weights does: every route but `/metrics`
answers 503 until then (so a readiness probe waits, and a cold start can be timed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from aicluster.runtime.replica_auth import SECRET_ENV, protect
from aicluster.runtime.simulated_core import (
    EngineModel,
    Plan,
    RequestError,
    SimulatedEngineOptions,
    chat_prompt,
    completion_prompt,
    token_id,
    tokenize,
)

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0)


class Metrics:
    """The engine's Prometheus registry (one per app: no process-wide state)."""

    def __init__(self, model: EngineModel, now: Callable[[], float]) -> None:
        self.registry = reg = CollectorRegistry()
        name = model.options.model
        lbl = ["model_name"]

        def gauge(metric: str, doc: str, fn: Callable[[], float]) -> None:
            Gauge(metric, doc, lbl, registry=reg).labels(name).set_function(fn)

        gauge(
            "vllm:num_requests_running",
            "Requests in the running batch.",
            lambda: model.counts(now())[1],
        )
        gauge(
            "vllm:num_requests_waiting",
            "Requests waiting for a slot.",
            lambda: model.counts(now())[0],
        )
        gauge(
            "vllm:gpu_cache_usage_perc",
            "Fraction of KV cache blocks in use (0-1).",
            lambda: model.cache.usage,
        )
        gauge(
            "vllm:kv_cache_usage_perc",
            "Fraction of KV cache blocks in use (0-1).",
            lambda: model.cache.usage,
        )

        def counter(metric: str, doc: str) -> Counter:
            return Counter(metric, doc, lbl, registry=reg).labels(name)

        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prompt tokens looked up.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prompt tokens found cached.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated.")
        self.success = Counter(
            "vllm:request_success", "Finished requests.", lbl + ["finished_reason"], registry=reg
        ).labels(name, "length")
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token.",
            lbl,
            buckets=TTFT_BUCKETS,
            registry=reg,
        ).labels(name)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Request latency.",
            lbl,
            buckets=LATENCY_BUCKETS,
            registry=reg,
        ).labels(name)
        self.queue = Histogram(
            "vllm:request_queue_time_seconds",
            "Time waiting for a slot.",
            lbl,
            buckets=LATENCY_BUCKETS,
            registry=reg,
        ).labels(name)

    def admitted(self, plan: Plan) -> None:
        self.prefix_queries.inc(plan.prompt_tokens)
        self.prefix_hits.inc(plan.cached_tokens)
        self.prompt_tokens.inc(plan.prompt_tokens)
        self.queue.observe(plan.start - plan.arrival)

    def first_token(self, plan: Plan) -> None:
        self.ttft.observe(plan.ttft)

    def finished(self, plan: Plan) -> None:
        self.generation_tokens.inc(plan.output_tokens)
        self.e2e.observe(plan.finish - plan.arrival)
        self.success.inc()


class SimulatedServer:
    """Request handling: parse, plan, wait for the plan's times, answer."""

    def __init__(self, options: SimulatedEngineOptions, clock: Callable[[], float]) -> None:
        self.options = options
        self.model = EngineModel(options)
        self._clock = clock
        self._t0 = clock()
        self.metrics = Metrics(self.model, self.now)

    def now(self) -> float:
        return (self._clock() - self._t0) / self.options.time_scale

    async def sleep_until(self, t: float) -> None:
        delay = (t - self.now()) * self.options.time_scale
        if delay > 0:
            await asyncio.sleep(delay)

    def plan(self, body: dict[str, Any], prompt: str) -> tuple[Plan, list[str]]:
        if body.get("model") not in (None, self.options.model):
            raise RequestError(f"The model '{body.get('model')}' does not exist.", "model", 404)
        n = body.get("max_completion_tokens") or body.get("max_tokens")
        n = self.options.default_max_tokens if n is None else n
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise RequestError("'max_tokens' must be a positive integer", "max_tokens")
        tokens = tokenize(prompt)
        if len(tokens) + n > self.options.max_model_len:
            raise RequestError(
                f"prompt ({len(tokens)} tokens) + max_tokens ({n}) exceeds the model's "
                f"length of {self.options.max_model_len} tokens",
                "max_tokens",
            )
        plan = self.model.admit(self.now(), tokens, n)
        self.metrics.admitted(plan)
        return plan, self.model.output_tokens(tokens, n)

    async def handle(self, body: dict[str, Any], chat: bool) -> Response:
        prompt = (
            chat_prompt(body.get("messages")) if chat else completion_prompt(body.get("prompt"))
        )
        plan, out = self.plan(body, prompt)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-sim-{plan.request_id}"
        usage = {
            "prompt_tokens": plan.prompt_tokens,
            "completion_tokens": plan.output_tokens,
            "total_tokens": plan.prompt_tokens + plan.output_tokens,
            "prompt_tokens_details": {"cached_tokens": plan.cached_tokens},
        }
        if body.get("stream"):
            opts = body.get("stream_options") or {}
            include_usage = bool(isinstance(opts, dict) and opts.get("include_usage"))
            return StreamingResponse(
                self._stream(plan, out, rid, chat, usage if include_usage else None),
                media_type="text/event-stream",
            )
        await self.sleep_until(plan.first_token)
        self.metrics.first_token(plan)
        await self.sleep_until(plan.finish)
        self.metrics.finished(plan)
        text = " ".join(out)
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length", "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return JSONResponse(
            self._envelope(rid, chat, False) | {"choices": [choice], "usage": usage}
        )

    def _envelope(self, rid: str, chat: bool, chunk: bool) -> dict[str, Any]:
        kind = (
            ("chat.completion.chunk" if chunk else "chat.completion")
            if chat
            else ("text_completion")
        )
        return {"id": rid, "object": kind, "created": int(time.time()), "model": self.options.model}

    async def _stream(
        self, plan: Plan, out: Sequence[str], rid: str, chat: bool, usage: dict[str, Any] | None
    ) -> AsyncIterator[str]:
        def event(choices: list[dict[str, Any]], **extra: Any) -> str:
            payload = self._envelope(rid, chat, True) | {"choices": choices} | extra
            return f"data: {json.dumps(payload)}\n\n"

        if chat:
            yield event(
                [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ]
            )
        for i, tok in enumerate(out):
            await self.sleep_until(plan.token_time(i))
            if i == 0:
                self.metrics.first_token(plan)
            piece = tok if i == 0 else " " + tok
            last = i == len(out) - 1
            reason = "length" if last else None
            body = {"delta": {"content": piece}} if chat else {"text": piece}
            yield event([{"index": 0, **body, "logprobs": None, "finish_reason": reason}])
        self.metrics.finished(plan)
        if usage is not None:
            yield event([], usage=usage)
        yield "data: [DONE]\n\n"

    def info(self) -> dict[str, Any]:
        return {
            "model_path": self.options.model,
            "engine": "simulated",
            **self.options.model_dump(),
            "is_generation": True,
        }


def _error(exc: RequestError) -> JSONResponse:
    kind = {404: "NotFoundError", 503: "ServiceUnavailableError"}.get(exc.status, "BadRequestError")
    return JSONResponse(
        {"error": {"message": exc.message, "type": kind, "param": exc.param, "code": exc.status}},
        status_code=exc.status,
    )


async def _json_body(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError as e:
        raise RequestError(f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    return body


def create_app(
    options: SimulatedEngineOptions | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    secret: str | None = None,
) -> FastAPI:
    """A fresh engine (its own cache, counters and metrics registry) behind a FastAPI app.
    The server object is at `app.state.engine` (its `.model` is the `EngineModel`).
    With `secret`, every route answers 401 unless the request carries it
    (runtime.replica_auth: a replica answers only the platform)."""
    server = SimulatedServer(options or SimulatedEngineOptions(), clock)
    app = FastAPI(title="aicluster simulated LLM engine")
    app.state.engine = server
    app.add_exception_handler(RequestError, lambda _r, e: _error(e))  # type: ignore[arg-type]
    if server.options.startup_s > 0:  # only then: a middleware costs every request
        ready_at = clock() + server.options.startup_s

        @app.middleware("http")
        async def loading(request: Request, call_next):
            if clock() < ready_at and request.url.path != "/metrics":
                return _error(RequestError("the engine is still loading", None, 503))
            return await call_next(request)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await server.handle(await _json_body(request), chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await server.handle(await _json_body(request), chat=True)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": server.options.model,
                    "object": "model",
                    "created": 0,
                    "owned_by": "aicluster",
                    "root": server.options.model,
                    "max_model_len": server.options.max_model_len,
                }
            ],
        }

    @app.get("/health")
    @app.get("/health_generate")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": "0.1.0-simulated"}

    @app.get("/server_info")
    @app.get("/get_server_info")
    @app.get("/model_info")
    @app.get("/get_model_info")
    async def info() -> dict[str, Any]:
        return server.info()

    @app.get("/loads")
    async def loads() -> dict[str, Any]:
        waiting, running = server.model.counts(server.now())
        return {"running": running, "waiting": waiting, "kv_cache_usage": server.model.cache.usage}

    @app.post("/tokenize")
    async def tokenize_route(request: Request) -> dict[str, Any]:
        body = await _json_body(request)
        text = (
            chat_prompt(body["messages"])
            if "messages" in body
            else completion_prompt(body.get("prompt", ""))
        )
        ids = [token_id(t) for t in tokenize(text)]
        return {"tokens": ids, "count": len(ids), "max_model_len": server.options.max_model_len}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return protect(app, secret)


def parse_args(argv: Sequence[str] | None = None) -> tuple[str, int, SimulatedEngineOptions]:
    """`--host`, `--port` and one flag per `SimulatedEngineOptions` field."""
    p = argparse.ArgumentParser(
        prog="python -m aicluster.runtime.simulated_engine",
        description="Simulated OpenAI-compatible LLM engine.",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    for name, f in SimulatedEngineOptions.model_fields.items():
        kind = f.annotation if f.annotation in (int, float) else str
        p.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            type=kind,
            default=None,
            help=f"{f.description or ''} (default {f.default})",
        )
    ns = vars(p.parse_args(argv))
    host, port = ns.pop("host"), ns.pop("port")
    return host, port, SimulatedEngineOptions(**{k: v for k, v in ns.items() if v is not None})


def main(argv: Sequence[str] | None = None) -> None:
    import uvicorn

    host, port, options = parse_args(argv)
    app = create_app(options, secret=os.environ.get(SECRET_ENV))
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
