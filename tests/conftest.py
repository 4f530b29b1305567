"""Shared test set-up.

Ray reads its environment when it is imported, so the session's Ray environment
(token auth, private temp dir, loopback) is set in pytest_configure, before any
test module is collected.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from harness import ControlPlaneProc, free_port, start_cluster

SESSION_HOME = Path(tempfile.mkdtemp(prefix="aic-test-"))


def pytest_configure(config):
    from aicluster.engine.rayenv import apply_ray_env

    apply_ray_env(SESSION_HOME / "ray-session")


@pytest.fixture(scope="session")
def session_home() -> Path:
    return SESSION_HOME


# One Ray cluster (a head and two 4-CPU, 2-GPU nodes) and one control plane for the whole
# test session, shared by tests/integration and the dashboard tests in tests/e2e.


@pytest.fixture(scope="session")
def ray_cluster(session_home):
    cluster, nodes = start_cluster(session_home / "ray-session")
    yield cluster, nodes
    cluster.shutdown()


@pytest.fixture(scope="session")
def control_plane(session_home, ray_cluster):
    cluster, _ = ray_cluster
    cp = ControlPlaneProc(session_home / "cp", cluster.address, free_port())
    cp.start()
    yield cp
    cp.stop()


@pytest.fixture(scope="session")
def admin(control_plane):
    return control_plane.client()


@pytest.fixture(scope="session")
def gpu_nodes(admin):
    return {n["node_id"]: n for n in admin.nodes() if n["pool"] == "gpu" and n["alive"]}
