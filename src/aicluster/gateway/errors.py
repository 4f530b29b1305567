"""Errors in OpenAI's format: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from fastapi.responses import JSONResponse


def openai_error(status: int, message: str, type_: str, code: str | None = None,
                 param: str | None = None) -> JSONResponse:  # fmt: skip
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


def unauthorized() -> JSONResponse:
    resp = openai_error(401, "missing or invalid API token", "authentication_error",
                        "invalid_api_key")  # fmt: skip
    resp.headers["WWW-Authenticate"] = "Bearer"
    return resp


def bad_request(message: str, param: str | None = None) -> JSONResponse:
    return openai_error(400, message, "invalid_request_error", None, param)


def model_not_found(model: str) -> JSONResponse:
    return openai_error(404, f"The model '{model}' does not exist", "invalid_request_error",
                        "model_not_found", "model")  # fmt: skip


def unavailable(message: str) -> JSONResponse:
    return openai_error(503, message, "service_unavailable", "no_replica")
