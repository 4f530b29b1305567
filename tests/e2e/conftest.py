"""The dashboard tests drive the session's control plane (see tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def dashboard_cp(control_plane):
    return control_plane


@pytest.fixture(scope="module")
def dashboard_admin(dashboard_cp):
    client = dashboard_cp.client()
    yield client
    client.close()
