"""Errors the store raises; the API maps them to 409 and 404."""

from __future__ import annotations


class Conflict(Exception):
    """A name that must be unique is taken."""


class NotFound(Exception):
    pass
