"""Artifact names: `team/name:version`, `team/name:tag`, kinds.

Vocabulary: a *ref* names an artifact and optionally one version of it. The part
after `:` is a *selector*: digits select the integer version, anything else is a
tag. `latest` is a reserved tag that always selects the newest version; it can
never be set or removed by hand. Parsing never raises anything but `RefError`,
whose message names the offending part, so the CLI and API can show it as is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KINDS = ("dataset", "checkpoint", "model")
LATEST = "latest"
MAX_VERSION = 2**31 - 1  # versions are SQL INTEGER columns
TEAM_RE = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
NAME_RE = re.compile(r"[a-z0-9]([a-z0-9._-]{0,126}[a-z0-9])?")
TAG_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class RefError(ValueError):
    """A malformed artifact name, version, tag or kind (the message names which)."""


@dataclass(frozen=True)
class ArtifactRef:
    team: str
    name: str
    selector: str | None = None  # None, digits (a version) or a tag

    @property
    def version(self) -> int | None:
        return int(self.selector) if is_number(self.selector) else None

    @property
    def tag(self) -> str | None:
        return self.selector if self.selector and not is_number(self.selector) else None

    @property
    def full_name(self) -> str:
        return f"{self.team}/{self.name}"

    def __str__(self) -> str:
        return self.full_name + (f":{self.selector}" if self.selector else "")


def parse_ref(text: str, default_team: str | None = None) -> ArtifactRef:
    """`[team/]name[:version|:tag]`; the team defaults to `default_team`."""
    if not isinstance(text, str) or not text.strip():
        raise RefError("artifact name is empty (expected team/name[:version])")
    text = text.strip()
    base, sep, selector = text.partition(":")
    if sep and not selector:
        raise RefError(f"{text!r}: nothing after ':' (expected a version number or a tag)")
    team, slash, name = base.rpartition("/")
    if not slash:
        team = default_team or ""
    if not team:
        raise RefError(f"{text!r}: no team (write team/name)")
    check_team(team)
    check_name(name)
    if selector:
        check_selector(selector)
    return ArtifactRef(team, name, selector or None)


def check_team(team: str) -> str:
    if not TEAM_RE.fullmatch(team or ""):
        raise RefError(f"team {team!r}: lowercase letters, digits and '-' (at most 63)")
    return team


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name or ""):
        raise RefError(
            f"artifact name {name!r}: lowercase letters, digits, '.', '_' and '-', "
            "starting and ending with a letter or digit (at most 128)"
        )
    return name


def is_number(selector: str | None) -> bool:
    """ASCII digits only (`str.isdigit` also accepts digits of other scripts and `²`)."""
    return bool(selector) and selector.isascii() and selector.isdigit()


def check_version(version: int, field: str = "version") -> int:
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= MAX_VERSION:
        raise RefError(f"{field} {version!r}: a whole number from 1 to {MAX_VERSION}")
    return version


def check_selector(selector: str) -> str:
    if is_number(selector):
        if int(selector) < 1:
            raise RefError(f"version {selector!r}: versions start at 1")
        if len(selector) > 12 or int(selector) > MAX_VERSION:
            shown = selector if len(selector) <= 24 else selector[:24] + "..."
            raise RefError(f"version {shown!r}: versions are at most {MAX_VERSION}")
        return selector
    return check_tag(selector, allow_latest=True)


def check_tag(tag: str, allow_latest: bool = False) -> str:
    if not isinstance(tag, str) or not TAG_RE.fullmatch(tag) or is_number(tag):
        raise RefError(
            f"tag {tag!r}: letters, digits, '.', '_' and '-', not all digits (at most 64)"
        )
    if tag == LATEST and not allow_latest:
        raise RefError("tag 'latest' is reserved: it always names the newest version")
    return tag


def check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise RefError(f"kind {kind!r}: must be one of {', '.join(KINDS)}")
    return kind
