"""One Ray cluster and one control plane for the whole integration session."""

from __future__ import annotations

import pytest

from harness import ControlPlaneProc, free_port, start_cluster


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
