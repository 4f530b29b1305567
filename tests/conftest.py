"""Shared test set-up.

Ray reads its environment when it is imported, so the session's Ray environment
(token auth, private temp dir, loopback) is set in pytest_configure, before any
test module is collected.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

SESSION_HOME = Path(tempfile.mkdtemp(prefix="aic-test-"))


def pytest_configure(config):
    from aicluster.engine.rayenv import apply_ray_env

    apply_ray_env(SESSION_HOME / "ray-session")


@pytest.fixture(scope="session")
def session_home() -> Path:
    return SESSION_HOME
