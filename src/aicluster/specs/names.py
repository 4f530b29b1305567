"""The one naming rule for everything a person names: teams, users, pools, jobs, services.

A name is a DNS label: 1-63 lowercase letters, digits and '-', starting and ending with a
letter or digit. It is safe in a path, a log line, a Ray label, a URL and a file name:
no '/', '..', whitespace or control characters can appear in one.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field

NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
NAME_RE = re.compile(NAME_PATTERN)
NAME_HELP = "1-63 lowercase letters, digits and '-', starting and ending with a letter or digit"

# A pydantic field type for a name; the error names the field it is used in.
Name = Annotated[str, Field(pattern=NAME_PATTERN, max_length=63, description=NAME_HELP)]


def is_name(value: object) -> bool:
    return isinstance(value, str) and NAME_RE.fullmatch(value) is not None


def check_name(value: object, what: str) -> str:
    """`value` if it is a valid name, else ValueError saying what is wrong with `what`."""
    if not is_name(value):
        shown = repr(value)[:80]
        raise ValueError(f"invalid {what} {shown}: use {NAME_HELP}")
    return value  # type: ignore[return-value]
