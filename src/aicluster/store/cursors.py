"""Opaque page cursors for the list routes' keyset pagination.

Vocabulary: a *page* is at most `limit` rows in a list's fixed order; its *cursor* is the
sort key of the last row it holds, so the next page is `WHERE key > cursor ORDER BY key
LIMIT n` (or `<` for a list newest first) on an index: never OFFSET, so a page costs the
same at the start of a list and after 100,000 rows, and rows added meanwhile neither
shift nor repeat the pages already read.

Invariants: a cursor is the URL-safe base64 of a JSON array whose first element names the
list it belongs to (`jobs`, `events`, ...) and whose rest is the key; `decode` refuses,
with BadCursor (a 400 naming `cursor`), anything else: bad base64 or JSON, another list's
cursor, a key of the wrong shape or types or that no database column could hold (an int
beyond 64 bits, a string with NUL). `page_of` is given up to `limit + 1` rows and
answers the first `limit` and the cursor of the last of them, or None when no row
follows (the end of the list).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_CURSOR = 512  # characters; every key here is far shorter
_INT64 = -(2**63)  # the smallest int a key may hold; the greatest is -_INT64 - 1

T = TypeVar("T")


class BadCursor(ValueError):
    """A cursor this list did not hand out; its message says what is wrong."""

    field = "cursor"


def encode(kind: str, *key: Any) -> str:
    raw = json.dumps([kind, *key], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode(cursor: str | None, kind: str, *types: type) -> tuple | None:
    """The key in `cursor` (None for none), checked against `kind` and the key's types."""
    if cursor is None or cursor == "":
        return None
    if len(cursor) > MAX_CURSOR:
        raise BadCursor(f"cursor is longer than {MAX_CURSOR} characters")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        value = json.loads(raw)
    except (binascii.Error, ValueError):
        raise BadCursor("cursor is not one this API handed out (not base64 JSON)") from None
    if not isinstance(value, list) or not value or value[0] != kind:
        raise BadCursor(f"cursor does not belong to the {kind} list")
    key = value[1:]
    if len(key) != len(types) or not all(_is(v, t) for v, t in zip(key, types, strict=True)):
        raise BadCursor(f"cursor of the {kind} list has a malformed key")
    return tuple(key)


def _is(value: Any, t: type) -> bool:
    """Of type `t` and storable: an int within 64 bits (not a bool), a str without NUL."""
    if t is int:
        return isinstance(value, int) and not isinstance(value, bool) and _INT64 <= value < -_INT64
    if t is str:
        return isinstance(value, str) and "\x00" not in value
    return isinstance(value, t)


def page_of(
    rows: Sequence[T], limit: int, kind: str, key: Callable[[T], tuple]
) -> tuple[list[T], str | None]:
    """The first `limit` of `rows` (read with `limit + 1`) and the next page's cursor."""
    page = list(rows[:limit])
    more = len(rows) > limit and bool(page)
    return page, encode(kind, *key(page[-1])) if more else None


def check_limit(limit: int) -> int:
    """`limit` within 1..MAX_LIMIT, else ValueError naming it (the routes validate first)."""
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be between 1 and {MAX_LIMIT}")
    return limit
