"""Where the client finds the API and its token.

Precedence, decided separately for the URL and for the token:

    explicit argument  >  environment (AICLUSTER_URL / AICLUSTER_TOKEN)
                       >  files under home_dir()  >  default

Files under `home_dir()` (AICLUSTER_HOME, default ~/.aicluster):
- `client.json`: {"url": "..."}, written by `aicluster up`;
- `admin.token`: the admin token on a single line.

Invariants:
- An empty string (argument or environment variable) counts as "not given".
- A missing, unreadable or malformed file counts as absent; loading the client
  config never raises for a broken local file, it falls back to the next source.
- The returned URL has a scheme and no trailing slash; the returned token is
  stripped of surrounding whitespace, or None.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_URL = "http://127.0.0.1:8765"
HOME_ENV = "AICLUSTER_HOME"
URL_ENV = "AICLUSTER_URL"
TOKEN_ENV = "AICLUSTER_TOKEN"
CLIENT_FILE = "client.json"
TOKEN_FILE = "admin.token"


@dataclass(frozen=True)
class ClientConfig:
    url: str
    token: str | None


def home_dir() -> Path:
    """AICLUSTER_HOME if set and non-empty, else ~/.aicluster; `~` is expanded."""
    return Path(os.environ.get(HOME_ENV) or "~/.aicluster").expanduser()


def normalize_url(url: str) -> str:
    """Add `http://` when no scheme is given and drop trailing slashes."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    return url.rstrip("/")


def _file_url(home: Path) -> str | None:
    try:
        data = json.loads((home / CLIENT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    url = data.get("url") if isinstance(data, dict) else None
    return url if isinstance(url, str) and url.strip() else None


def _file_token(home: Path) -> str | None:
    try:
        text = (home / TOKEN_FILE).read_text(encoding="utf-8")
    except (OSError, ValueError):
        return None
    lines = text.strip().splitlines()
    return lines[0].strip() if lines and lines[0].strip() else None


def load_client_config(url: str | None = None, token: str | None = None) -> ClientConfig:
    """Resolve the API URL and token (see the module docstring for precedence)."""
    home = home_dir()
    chosen_url = url or os.environ.get(URL_ENV) or _file_url(home) or DEFAULT_URL
    chosen_token = token or os.environ.get(TOKEN_ENV) or _file_token(home)
    if chosen_token is not None:
        chosen_token = chosen_token.strip() or None
    return ClientConfig(url=normalize_url(chosen_url), token=chosen_token)
