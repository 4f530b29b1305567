"""Errors in OpenAI's format: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import json
import time

from fastapi.responses import JSONResponse


def openai_error(
    status: int, message: str, type_: str, code: str | None = None, param: str | None = None
) -> JSONResponse:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


def unauthorized_message(refusal=None) -> str:
    """Why a token was refused: the API server's words (api.app) for a known token that
    is expired or revoked (store.identity.Refusal), and when; else the usual."""
    if refusal is None:
        return "missing or invalid API token"
    at = ""
    if refusal.at is not None:
        at = " at " + time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(refusal.at))
    return f"API token {refusal.why}{at}: ask an admin for a new one"


def unauthorized(refusal=None) -> JSONResponse:
    code = "invalid_api_key" if refusal is None else f"{refusal.why}_api_key"
    resp = openai_error(401, unauthorized_message(refusal), "authentication_error", code)
    resp.headers["WWW-Authenticate"] = "Bearer"
    return resp


def rate_limited(refused) -> JSONResponse:
    """A request over a rate limit (gateway.ratelimit.Refused): 429, Retry-After, and
    OpenAI's body (type `requests` or `tokens`, code `rate_limit_exceeded`)."""
    resp = openai_error(429, refused.message, refused.kind, "rate_limit_exceeded")
    resp.headers["Retry-After"] = str(refused.retry_after_s)
    return resp


def bad_request(message: str, param: str | None = None) -> JSONResponse:
    return openai_error(400, message, "invalid_request_error", None, param)


def model_not_found(model: str) -> JSONResponse:
    return openai_error(
        404,
        f"The model '{model}' does not exist",
        "invalid_request_error",
        "model_not_found",
        "model",
    )


def unavailable(message: str) -> JSONResponse:
    return openai_error(503, message, "service_unavailable", "no_replica")


def timed_out(message: str, retry_after_s: int) -> JSONResponse:
    """A held request that no replica came for in time: 503 (the service is not available
    yet; a client may retry after `retry_after_s`), not a gateway timeout."""
    resp = openai_error(503, message, "service_unavailable", "no_replica_in_time")
    resp.headers["Retry-After"] = str(retry_after_s)
    return resp


def too_large(limit: int) -> JSONResponse:
    return openai_error(
        413,
        f"the request body is larger than {limit // 2**20} MiB",
        "invalid_request_error",
        "body_too_large",
    )


_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def error_type(status: int) -> str:
    return _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def from_upstream(status: int, raw: bytes) -> JSONResponse:
    """An engine's error answer, whatever its shape (OpenAI's, FastAPI's `{"detail": ...}`,
    plain text), in OpenAI's format with the engine's status."""
    try:
        doc = json.loads(raw) if raw else None
    except (ValueError, RecursionError):
        doc = None
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        param = err.get("param")
        return openai_error(
            status,
            err["message"],
            str(err.get("type") or error_type(status)),
            _code(err.get("code")),
            param if isinstance(param, str) else None,
        )
    detail = doc.get("detail") if isinstance(doc, dict) else None
    if isinstance(detail, str):
        message = detail
    elif detail is not None:
        message = json.dumps(detail)[:2000]
    else:
        message = raw.decode("utf-8", "replace").strip()[:2000] or f"the engine answered {status}"
    return openai_error(status, message, error_type(status), None)


def _code(code) -> str | None:
    return None if code is None else str(code)
