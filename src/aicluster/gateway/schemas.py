"""OpenAPI description of the gateway's OpenAI routes: request bodies and error answers.

The bodies are documented, not validated here: the gateway reads them itself (bounded,
with depth errors as 400s) and the engine validates the rest, so unknown fields pass
through (`extra="allow"`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _OpenAIBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(description="the service's name, or TEAM/NAME")
    stream: bool | None = Field(default=None, description="server-sent events")
    user: str | None = Field(default=None, description="end user id (session affinity)")


class CompletionRequest(_OpenAIBody):
    prompt: str | list[str] | None = None
    max_tokens: int | None = None
    temperature: float | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: Any = None


class ChatCompletionRequest(_OpenAIBody):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None


class EmbeddingRequest(_OpenAIBody):
    input: str | list[str]
    encoding_format: str | None = None


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class OpenAIError(BaseModel):
    error: OpenAIErrorDetail


BODIES: dict[str, type[BaseModel]] = {
    "completions": CompletionRequest,
    "chat/completions": ChatCompletionRequest,
    "embeddings": EmbeddingRequest,
}

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {
        "model": OpenAIError,
        "description": "the body is not a JSON object, nests too "
        "deeply, or has no `model`; or the engine refused a field",
    },
    401: {
        "model": OpenAIError,
        "description": "missing or invalid API token; an expired or revoked one says which",
    },
    404: {
        "model": OpenAIError,
        "description": "no such model for this caller (another "
        "team's service is not found), or the engine's own 404",
    },
    413: {"model": OpenAIError, "description": "the body is larger than the gateway accepts"},
    429: {
        "model": OpenAIError,
        "description": "the caller's team or token is over a rate limit (requests/s or "
        "tokens/min; type `requests` or `tokens`, code `rate_limit_exceeded`), with "
        "Retry-After",
    },
    503: {
        "model": OpenAIError,
        "description": "no replica could answer; or none became ready within the hold time "
        "(scale from zero; code `no_replica_in_time`, with Retry-After); or the service was "
        "deleted while the request waited for one",
    },
}


def openapi_extra(path: str) -> dict[str, Any]:
    """The request body of route `path`, inline (the gateway parses it itself)."""
    schema = BODIES[path].model_json_schema(ref_template="#/components/schemas/{model}")
    defs = schema.pop("$defs", {})
    for name, sub in defs.items():  # inline the few nested models
        _inline(schema, f"#/components/schemas/{name}", sub)
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _inline(node: Any, ref: str, sub: dict) -> None:
    if isinstance(node, dict):
        for k, v in list(node.items()):
            if isinstance(v, dict) and v.get("$ref") == ref:
                node[k] = sub
            else:
                _inline(v, ref, sub)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            if isinstance(v, dict) and v.get("$ref") == ref:
                node[i] = sub
            else:
                _inline(v, ref, sub)
