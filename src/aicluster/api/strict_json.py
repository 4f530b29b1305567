"""JSON bodies parsed strictly, and JSON answers that cannot be broken by one bad value.

Python's `json` accepts `NaN`, `Infinity` and `1e309` (as inf), and raises RecursionError
on deep nesting. Here a body is refused, before any route sees it, when it holds a
non-finite number (422 naming the field), an integer past 64 bits (422 naming the field),
more than MAX_DEPTH levels of nesting, or text that is not UTF-8 JSON (400).
"""

from __future__ import annotations

import json
import math
from typing import Any

from fastapi import HTTPException, Request, Response
from fastapi.routing import APIRoute

from aicluster.specs.limits import INT64_MAX

MAX_DEPTH = 32


class _Refused:
    """Stands in for a number that cannot be accepted, until its place is known."""

    def __init__(self, why: str):
        self.why = why


def _refuse(status: int, message: str, field: str) -> HTTPException:
    return HTTPException(status, {"message": message, "field": field})


def loads(raw: bytes | str) -> Any:
    refused: list[_Refused] = []

    def mark(why: str) -> _Refused:
        refused.append(_Refused(why))
        return refused[-1]

    def parse_float(text: str) -> float | _Refused:
        value = float(text)
        return value if math.isfinite(value) else mark(f"{text[:40]} is not a finite number")

    def parse_int(text: str) -> int | _Refused:
        if len(text) > 20:
            return mark("integer out of range (64 bits)")
        value = int(text)
        return (
            value
            if -INT64_MAX - 1 <= value <= INT64_MAX
            else mark("integer out of range (64 bits)")
        )

    try:
        doc = json.loads(
            raw,
            parse_float=parse_float,
            parse_int=parse_int,
            parse_constant=lambda name: mark(f"{name} is not a valid JSON number"),
        )
    except RecursionError:
        raise _refuse(
            400, f"the JSON body is nested more than {MAX_DEPTH} levels deep", "(body)"
        ) from None
    except UnicodeDecodeError:
        raise _refuse(400, "the body is not UTF-8 encoded JSON", "(body)") from None
    _check(doc, bool(refused))
    return doc


def _check(doc: Any, has_refused: bool) -> None:
    """Depth and refused numbers, walked without recursion; the error names the field."""
    stack: list[tuple[Any, tuple, int]] = [(doc, (), 0)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth >= MAX_DEPTH:
                field = ".".join(map(str, path[:8])) + ("..." if len(path) > 8 else "")
                raise _refuse(
                    400,
                    f"the JSON body is nested more than {MAX_DEPTH} levels deep",
                    field or "(body)",
                )
            items = node.items() if isinstance(node, dict) else enumerate(node)
            stack.extend(
                (v, path + (k,), depth + 1)
                for k, v in items
                if has_refused or isinstance(v, (dict, list))
            )
        elif isinstance(node, _Refused):
            field = ".".join(str(p) for p in path) or "(body)"
            raise _refuse(422, f"{field}: {node.why}", field)


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads(await self.body())
        return self._json


class StrictJSONRoute(APIRoute):
    """An APIRoute whose JSON body is parsed by `loads` (FastAPI's custom route class hook)."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict


def finite(value: Any) -> Any:
    """`value` with every non-finite float replaced by None, so that a row stored before
    these checks existed cannot make a listing fail to serialise."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value
