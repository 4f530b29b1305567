"""The query parameters and answer of every paginated list route (store.cursors).

A list answers `{KEY: [...page...], "next_cursor": str | None}`: the page under the key
the route always used (so clients that read the list keep working) and the cursor of the
next page, null at the end. `limit` out of 1..MAX_LIMIT is a 422 naming `limit`; a cursor
the list did not hand out is a 400 naming `cursor` (store.cursors.BadCursor).
"""

from __future__ import annotations

from fastapi import Query

from aicluster.store.cursors import DEFAULT_LIMIT, MAX_CURSOR, MAX_LIMIT

LIMIT = Query(
    default=DEFAULT_LIMIT,
    ge=1,
    le=MAX_LIMIT,
    description=f"at most this many per page (1..{MAX_LIMIT})",
)
CURSOR = Query(
    default=None,
    max_length=MAX_CURSOR,
    description="the `next_cursor` of the previous page (omit for the first page)",
)


def page_body(key: str, items: list, next_cursor: str | None) -> dict:
    return {key: items, "next_cursor": next_cursor}
