"""The environment every Ray process of one aicluster installation shares.

Invariants: token authentication is always on, with the token in a 0600 file
under AICLUSTER_HOME; Ray's temp dir is private to the installation; in loopback
mode every Ray port binds to 127.0.0.1 and nothing resolves to a public address.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import tempfile
from pathlib import Path


def ray_token_path(home: Path) -> Path:
    return home / "ray" / "auth_token"


def ensure_ray_token(home: Path) -> Path:
    path = ray_token_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    return path


def ray_temp_dir(home: Path) -> Path:
    """Short (Unix socket paths are limited to ~107 bytes) and unique per home."""
    tag = hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / f"aic-{os.getuid()}-{tag}"


def ray_env(home: Path, loopback: bool = True) -> dict[str, str]:
    tmp = ray_temp_dir(home)
    (tmp / "ray").mkdir(parents=True, exist_ok=True)
    os.chmod(tmp, 0o700)  # Ray's sessions, sockets and logs: the platform's alone
    env = {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(ensure_ray_token(home)),
        "RAY_TMPDIR": str(tmp),
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_DISABLE_IMPORT_WARNING": "1",
    }
    if loopback:
        # Makes Ray resolve "localhost" to 127.0.0.1 instead of the network card's address.
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    return env


def apply_ray_env(home: Path, loopback: bool = True) -> dict[str, str]:
    """Set the Ray environment in this process; call before `import ray`.

    Values already in the environment win: a process started by `aicluster up`
    (or by a test harness) inherits the installation's settings from its parent.
    """
    for key, value in ray_env(home, loopback).items():
        os.environ.setdefault(key, value)
    return {k: os.environ[k] for k in ray_env(home, loopback)}
