"""Ollama's API over the cluster: `/api/chat`, `/api/generate`, `/api/embed`, `/api/tags`,
`/api/show`, `/api/version`, translated to and from the OpenAI routes of a service's
replicas, so Ollama's clients get replicas on many machines (which Ollama cannot do).

Vocabulary:
- model: a service, spelled as on the OpenAI routes (`NAME` of the caller's team, or
  `TEAM/NAME`); every engine works behind it, Ollama's own included.
- a stream: NDJSON, one JSON object per line; every line but the last has `done: false`,
  the last `done: true` with `done_reason` and the counts (`prompt_eval_count`,
  `eval_count`) and durations (nanoseconds) Ollama reports. `stream` defaults to true, as
  in Ollama.

Invariants:
- Same caller, same rules as the OpenAI routes: the bearer token (users' only), the
  service lookup, holding while a service is at zero, routing, retries before the first
  byte, and the in-flight count (`Gateway.open`, closed exactly once).
- Every error is Ollama's shape, `{"error": MESSAGE}`, with the status the OpenAI route
  would give (a malformed field is a 400 naming it); a stream that breaks after its first
  line ends with an `{"error": ...}` line, as Ollama's do.
- `/api/embed` on a service whose engine has no embeddings route is a 501.
- Rate limits and usage as on the OpenAI routes (`Gateway.over_limit`, `Gateway.record`):
  a 429 with Retry-After in Ollama's shape; tokens from the engine's usage (asked for on
  every stream), else one completion token per content chunk.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.background import BackgroundTask

from aicluster.gateway.bodies import BodyError, parse
from aicluster.gateway.errors import unauthorized_message
from aicluster.gateway.streams import Opened, ProxiedStream, read_bounded, read_upstream
from aicluster.gateway.upstream import ReplicaError
from aicluster.specs.limits import MAX_OPENAI_BODY_BYTES as MAX_BODY_BYTES
from aicluster.store.identity import Principal

if TYPE_CHECKING:
    from aicluster.gateway.proxy import Gateway

MAX_ANSWER_BYTES = 64 << 20  # a whole (non-streaming) answer read from a replica
# Ollama option -> OpenAI field (the engines take these; vLLM takes top_k and min_p too).
OPTIONS = {
    "num_predict": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "seed",
    "stop": "stop",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repeat_penalty": "repetition_penalty",
}
VERSION = "0.6.3-aicluster"  # what `/api/version` answers: Ollama's API, this cluster


class BadField(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def unauthorized(refusal=None) -> JSONResponse:
    return error(401, unauthorized_message(refusal), {"WWW-Authenticate": "Bearer"})


def from_openai(resp: Response) -> JSONResponse:
    """The gateway's (or an engine's) OpenAI-format error as Ollama's, status kept."""
    try:
        message = json.loads(bytes(resp.body))["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = f"the gateway answered {resp.status_code}"
    keep = {
        k: v for k, v in resp.headers.items() if k.lower() in ("retry-after", "www-authenticate")
    }
    return error(resp.status_code, message, keep)


def now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


# -- requests: Ollama -> OpenAI ---------------------------------------------------------------


def _options(doc: dict) -> dict[str, Any]:
    opts = doc.get("options")
    if opts is None:
        return {}
    if not isinstance(opts, dict):
        raise BadField("'options' must be an object")
    out = {OPTIONS[k]: v for k, v in opts.items() if k in OPTIONS and v is not None}
    if "max_tokens" in out and (
        not isinstance(out["max_tokens"], int) or isinstance(out["max_tokens"], bool)
    ):
        raise BadField("'options.num_predict' must be an integer")
    if out.get("max_tokens", 0) < 0:  # Ollama: -1 is "until the model stops"
        del out["max_tokens"]
    return out


def _format(doc: dict) -> dict[str, Any]:
    fmt = doc.get("format")
    if fmt in (None, ""):
        return {}
    if fmt == "json":
        return {"response_format": {"type": "json_object"}}
    if isinstance(fmt, dict):
        return {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "format", "schema": fmt},
            }
        }
    raise BadField("'format' must be \"json\" or a JSON schema")


def _stream(doc: dict) -> bool:
    stream = doc.get("stream", True)
    if stream is None:
        return True
    if not isinstance(stream, bool):
        raise BadField("'stream' must be true or false")
    return stream


def _content(text: Any, images: Any, where: str) -> Any:
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise BadField(f"'{where}' must be a string")
    if images in (None, []):
        return text
    if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
        raise BadField("'images' must be a list of base64 strings")
    parts: list[dict] = [{"type": "text", "text": text}] if text else []
    for img in images:
        url = img if img.startswith("data:") else f"data:image/png;base64,{img}"
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


def _message(m: Any, i: int) -> dict[str, Any]:
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise BadField(f"'messages[{i}].role' is required (a string)")
    out: dict[str, Any] = {
        "role": m["role"],
        "content": _content(m.get("content"), m.get("images"), f"messages[{i}].content"),
    }
    calls = m.get("tool_calls")
    if isinstance(calls, list) and calls:
        out["tool_calls"] = [
            {
                "id": f"call_{i}_{j}",
                "type": "function",
                "function": {
                    "name": (c.get("function") or {}).get("name", ""),
                    "arguments": json.dumps((c.get("function") or {}).get("arguments", {})),
                },
            }
            for j, c in enumerate(calls)
            if isinstance(c, dict)
        ]
    return out


def chat_body(doc: dict, served: str) -> tuple[dict, bool]:
    messages = doc.get("messages")
    if messages is None:
        messages = []
    if not isinstance(messages, list):
        raise BadField("'messages' must be a list")
    stream = _stream(doc)
    body: dict[str, Any] = {
        "model": served,
        "messages": [_message(m, i) for i, m in enumerate(messages)],
        "stream": stream,
        **_options(doc),
        **_format(doc),
    }
    if isinstance(doc.get("tools"), list) and doc["tools"]:
        body["tools"] = doc["tools"]
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body, stream


def generate_body(doc: dict, served: str) -> tuple[str, dict, bool]:
    """(OpenAI route, body, stream): `raw` prompts go to completions as they are, the others
    to chat completions (the engine applies the model's template, as Ollama does)."""
    prompt, system = doc.get("prompt") or "", doc.get("system")
    if not isinstance(prompt, str):
        raise BadField("'prompt' must be a string")
    if system is not None and not isinstance(system, str):
        raise BadField("'system' must be a string")
    stream = _stream(doc)
    extra: dict[str, Any] = {"stream": stream, **_options(doc), **_format(doc)}
    if stream:
        extra["stream_options"] = {"include_usage": True}
    if doc.get("raw") is True:
        return "completions", {"model": served, "prompt": prompt, **extra}, stream
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": _content(prompt, doc.get("images"), "prompt")})
    return "chat/completions", {"model": served, "messages": messages, **extra}, stream


# -- answers: OpenAI -> Ollama ----------------------------------------------------------------


def _tool_calls(calls: Any) -> list[dict] | None:
    if not isinstance(calls, list) or not calls:
        return None
    out = []
    for c in calls:
        fn = (c or {}).get("function") or {}
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            args = {}
        out.append({"function": {"name": fn.get("name", ""), "arguments": args}})
    return out


def _done_reason(finish: Any) -> str:
    return "length" if finish == "length" else "stop"


class _Tally:
    """What the last line of an answer reports."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.first: float | None = None
        self.prompt_tokens = self.completion_tokens = 0
        self.finish: Any = None
        self.reported = False  # the engine reported its usage
        self.chunks = 0  # content chunks streamed

    def usage(self, usage: Any) -> None:
        if isinstance(usage, dict):
            self.reported = True
            self.prompt_tokens = usage.get("prompt_tokens") or 0
            self.completion_tokens = usage.get("completion_tokens") or 0

    def tokens(self) -> tuple[int, int]:
        """(prompt, completion) tokens, for the usage records (gateway.usage)."""
        if self.reported:
            return _count(self.prompt_tokens), _count(self.completion_tokens)
        return 0, self.chunks

    def final(self) -> dict[str, Any]:
        end = time.monotonic()
        first = self.first if self.first is not None else end
        return {
            "done": True,
            "done_reason": _done_reason(self.finish),
            "total_duration": int((end - self.started) * 1e9),
            "load_duration": 0,
            "prompt_eval_count": self.prompt_tokens,
            "prompt_eval_duration": int((first - self.started) * 1e9),
            "eval_count": self.completion_tokens,
            "eval_duration": int((end - first) * 1e9),
        }


def _piece(choice: dict, chat: bool) -> tuple[str, list[dict] | None]:
    if not chat:
        return choice.get("text") or "", None
    delta = choice.get("delta") or choice.get("message") or {}
    return delta.get("content") or "", _tool_calls(delta.get("tool_calls"))


def _line(model: str, chat: bool, text: str, calls: list[dict] | None, **extra: Any) -> bytes:
    doc: dict[str, Any] = {"model": model, "created_at": now_iso()}
    if chat:
        doc["message"] = {"role": "assistant", "content": text}
        if calls:
            doc["message"]["tool_calls"] = calls
    else:
        doc["response"] = text
    doc.update(extra)
    return json.dumps(doc).encode() + b"\n"


async def _ndjson(
    opened: Opened, model: str, chat: bool, upstream_chat: bool, tally: _Tally
) -> AsyncIterator[bytes]:
    """The replica's server-sent events as Ollama's NDJSON lines (`chat`: /api/chat's
    shape; `upstream_chat`: the events are chat completion chunks)."""
    try:
        async for line in opened.upstream.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            tally.usage(chunk.get("usage"))
            for choice in chunk.get("choices") or ():
                tally.finish = choice.get("finish_reason") or tally.finish
                text, calls = _piece(choice, upstream_chat)
                if text or calls:
                    tally.chunks += 1
                    if tally.first is None:
                        tally.first = time.monotonic()
                        opened.on_first()
                    yield _line(model, chat, text, calls, done=False)
    except (ReplicaError, ValueError, AttributeError) as exc:
        yield json.dumps({"error": f"the replica's stream broke: {type(exc).__name__}"}).encode()
        yield b"\n"
        return
    yield _line(model, chat, "", None, **tally.final())


async def _whole(
    opened: Opened, model: str, chat: bool, upstream_chat: bool, tally: _Tally
) -> JSONResponse:
    try:
        raw = await read_upstream(opened.upstream, MAX_ANSWER_BYTES)
        opened.on_first()
        doc = json.loads(raw)
        choice = (doc.get("choices") or [{}])[0]
    except (ReplicaError, ValueError, AttributeError, IndexError):
        return error(502, "the replica's answer could not be read")
    finally:
        await opened.close()
    tally.first = time.monotonic()
    tally.usage(doc.get("usage"))
    tally.finish = choice.get("finish_reason")
    text, calls = _piece(choice, upstream_chat)
    return JSONResponse(json.loads(_line(model, chat, text, calls, **tally.final())))


# -- routes -----------------------------------------------------------------------------------


class OllamaRoutes:
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway

    def router(self) -> APIRouter:
        r = APIRouter(tags=["ollama"])
        doc = {
            400: {"description": 'a malformed field, named: `{"error": message}`'},
            401: {"description": "missing or invalid API token"},
            404: {"description": "no such model for this caller"},
            413: {"description": "the body is larger than the gateway accepts"},
            429: {"description": "over a rate limit of the team or token, with Retry-After"},
            501: {"description": "(embed) the service's engine has no embeddings"},
            503: {"description": "no replica could answer, or none became ready in time"},
        }
        r.add_api_route("/api/chat", self.chat, methods=["POST"], responses=doc)
        r.add_api_route("/api/generate", self.generate, methods=["POST"], responses=doc)
        r.add_api_route("/api/embed", self.embed, methods=["POST"], responses=doc)
        r.add_api_route("/api/show", self.show, methods=["POST"], responses=doc)
        r.add_api_route("/api/tags", self.tags, methods=["GET"], responses={401: doc[401]})
        r.add_api_route("/api/version", self.version, methods=["GET"], responses={401: doc[401]})
        return r

    async def _read(self, request: Request, limited: bool = True):
        """(caller, body, model as spelled, service) or an error answer (`limited`: the
        caller's rate limits apply)."""
        who = self.gw.who(request.headers)
        if not isinstance(who, Principal):
            return unauthorized(who)
        refused = self.gw.over_limit(who) if limited else None
        if refused is not None:
            return error(429, refused.message, {"Retry-After": str(refused.retry_after_s)})
        raw = await read_bounded(request, MAX_BODY_BYTES)
        if raw is None:
            return error(413, f"the request body is larger than {MAX_BODY_BYTES >> 20} MiB")
        try:
            doc = parse(raw).doc
        except BodyError as exc:
            return error(400, str(exc))
        model = doc.get("model", doc.get("name"))
        if not isinstance(model, str) or not model:
            return error(400, "'model' is required (a string)")
        ep = self.gw.resolve(who, model)
        if ep is None:
            return error(404, f"model '{model}' not found")
        return who, doc, model, ep

    async def _answer(self, request: Request, chat_route: bool) -> Response:
        got = await self._read(request)
        if isinstance(got, Response):
            return got
        who, doc, model, ep = got
        served = ep.served_model or ep.name
        try:
            if chat_route:
                path, (body, stream) = "chat/completions", chat_body(doc, served)
            else:
                path, body, stream = generate_body(doc, served)
        except BadField as exc:
            return error(400, exc.message)
        if not (body["messages"] if chat_route else doc.get("prompt") or doc.get("images")):
            # Ollama: no messages (no prompt) only loads the model; answer at once.
            line = _line(model, chat_route, "", None, done=True, done_reason="load")
            return JSONResponse(json.loads(line))
        chat, upstream_chat = chat_route, path == "chat/completions"
        tally = _Tally(time.monotonic())
        opened = await self.gw.open(
            ep,
            path,
            json.dumps(body).encode(),
            body,
            request.headers,
            {"content-type": "application/json"},
        )
        if not isinstance(opened, Opened):
            self.gw.record(who, ep, 0, 0, error=True)
            return from_openai(opened)
        if not stream:
            answer = await _whole(opened, model, chat, upstream_chat, tally)
            self.gw.record(who, ep, *tally.tokens(), error=answer.status_code >= 400)
            return answer
        self.gw.on_close(opened, lambda: self.gw.record(who, ep, *tally.tokens()))
        return ProxiedStream(
            _ndjson(opened, model, chat, upstream_chat, tally),
            media_type="application/x-ndjson",
            background=BackgroundTask(opened.close),
        )

    async def chat(self, request: Request) -> Response:
        return await self._answer(request, chat_route=True)

    async def generate(self, request: Request) -> Response:
        return await self._answer(request, chat_route=False)

    async def embed(self, request: Request) -> Response:
        got = await self._read(request)
        if isinstance(got, Response):
            return got
        who, doc, model, ep = got
        inputs = doc.get("input", doc.get("prompt"))
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not all(isinstance(i, str) for i in inputs):
            return error(400, "'input' must be a string or a list of strings")
        body: dict[str, Any] = {"model": ep.served_model or ep.name, "input": inputs}
        if isinstance(doc.get("dimensions"), int):
            body["dimensions"] = doc["dimensions"]
        started = time.monotonic()
        opened = await self.gw.open(
            ep,
            "embeddings",
            json.dumps(body).encode(),
            body,
            request.headers,
            {"content-type": "application/json"},
        )
        if not isinstance(opened, Opened):
            self.gw.record(who, ep, 0, 0, error=True)
            if opened.status_code in (404, 405):
                return error(501, f"model '{model}' (engine {ep.engine}) does not serve embeddings")
            return from_openai(opened)
        try:
            answer = json.loads(await read_upstream(opened.upstream, MAX_ANSWER_BYTES))
            rows = sorted(answer["data"], key=lambda d: d.get("index", 0))
            vectors = [d["embedding"] for d in rows]
        except (ReplicaError, ValueError, KeyError, TypeError, AttributeError):
            self.gw.record(who, ep, 0, 0, error=True)
            return error(502, "the replica's embeddings could not be read")
        finally:
            await opened.close()
        usage = answer.get("usage") or {}
        self.gw.record(who, ep, _count(usage.get("prompt_tokens")), 0)
        return JSONResponse(
            {
                "model": model,
                "embeddings": vectors,
                "total_duration": int((time.monotonic() - started) * 1e9),
                "load_duration": 0,
                "prompt_eval_count": usage.get("prompt_tokens") or 0,
            }
        )

    async def tags(self, request: Request) -> Response:
        who = self.gw.who(request.headers)
        if not isinstance(who, Principal):
            return unauthorized(who)
        home = who.team or "default"
        models = []
        for ep in self.gw.visible(who):
            name = ep.name if ep.team == home else f"{ep.team}/{ep.name}"
            models.append({"name": name, "model": name, **_model_facts(ep)})
        return JSONResponse({"models": models})

    async def show(self, request: Request) -> Response:
        got = await self._read(request, limited=False)
        if isinstance(got, Response):
            return got
        _who, _doc, _model, ep = got
        facts = _model_facts(ep)
        return JSONResponse(
            {
                "modelfile": "",
                "parameters": "",
                "template": "",
                "details": facts["details"],
                "model_info": {
                    "general.architecture": ep.engine,
                    "aicluster.team": ep.team,
                    "aicluster.service": ep.name,
                    "aicluster.served_model": ep.served_model or ep.name,
                    "aicluster.ready_replicas": len(ep.replicas),
                    "aicluster.routing": ep.routing,
                },
                "capabilities": ["completion"],
                "modified_at": facts["modified_at"],
            }
        )

    async def version(self, request: Request) -> Response:
        who = self.gw.who(request.headers)
        if not isinstance(who, Principal):
            return unauthorized(who)
        return JSONResponse({"version": VERSION})


def _count(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


def _model_facts(ep) -> dict[str, Any]:
    digest = hashlib.sha256(f"{ep.team}/{ep.name}/{ep.served_model}".encode()).hexdigest()
    return {
        "modified_at": "1970-01-01T00:00:00Z",
        "size": 0,
        "digest": digest,
        "details": {
            "parent_model": "",
            "format": ep.engine,
            "family": ep.engine,
            "families": [ep.engine],
            "parameter_size": "",
            "quantization_level": "",
        },
    }
