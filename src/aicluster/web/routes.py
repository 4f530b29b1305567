"""Routes that serve the dashboard's static files: `/` redirects to `/ui/`.

Invariants: these routes need no token (the files hold no data); only plain files
directly inside `static/` are served, by name, never a path that leaves it; every
answer carries a Content-Security-Policy that allows scripts, styles and API
calls from this origin alone, so the page can load nothing from elsewhere.
"""

from __future__ import annotations

import re
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
}
_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$")
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}


def _static_file(name: str) -> tuple[bytes, str] | None:
    """(content, media type) of `static/<name>`, or None when there is no such file."""
    if not _NAME.match(name):
        return None
    suffix = name[name.rfind(".") :] if "." in name else ""
    media = MEDIA_TYPES.get(suffix)
    if media is None:
        return None
    entry = resources.files("aicluster.web").joinpath("static").joinpath(name)
    if not entry.is_file():
        return None
    return entry.read_bytes(), media


def _serve(name: str) -> Response:
    found = _static_file(name)
    if found is None:
        return Response("not found\n", status_code=404, media_type="text/plain")
    body, media = found
    return Response(body, media_type=media, headers=SECURITY_HEADERS)


def web_router(principal_dependency=None) -> APIRouter:
    """The dashboard's routes. `principal_dependency` is accepted so the factory has
    the same shape as the API's others; the page itself is public by design."""
    del principal_dependency
    r = APIRouter(include_in_schema=False)

    @r.get("/")
    def root():
        return RedirectResponse("/ui/", status_code=307)

    @r.get("/ui")
    def ui_no_slash():
        return RedirectResponse("/ui/", status_code=307)

    @r.get("/ui/")
    def index():
        return _serve("index.html")

    @r.get("/ui/{name}")
    def static(name: str):
        return _serve(name)

    return r
