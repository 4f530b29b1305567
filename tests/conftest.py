"""Shared test set-up.

Ray reads its environment when it is imported, so the session's Ray environment
(token auth, private temp dir, loopback) is set in pytest_configure, before any
test module is collected.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from harness import ControlPlaneProc, free_port, start_cluster

SESSION_HOME = Path(tempfile.mkdtemp(prefix="aic-test-"))


def pytest_configure(config):
    from aicluster.engine.rayenv import apply_ray_env

    # Stands for an operator's cloud credentials in the environment the nodes start with;
    # tests/integration/test_sandbox.py checks that no workload ever sees it.
    os.environ.setdefault("AWS_AICLUSTER_CANARY_SECRET", "canary-" + os.urandom(8).hex())

    apply_ray_env(SESSION_HOME / "ray-session")


def pytest_unconfigure(config):
    # The session's folder (Ray's session files, the control plane's home and logs) goes
    # when the run passed; a failed run keeps it for its logs.
    if getattr(config, "_aic_failed", True) is False:
        shutil.rmtree(SESSION_HOME, ignore_errors=True)


def pytest_sessionfinish(session, exitstatus):
    session.config._aic_failed = exitstatus != 0


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
def control_plane(session_home, ray_cluster, request):
    """The session's control plane: on SQLite, or on a PostgreSQL database of the
    session's server when AICLUSTER_TEST_STATE=postgresql (`make test-postgresql` runs
    the integration suite so, as a second CI job would)."""
    cluster, _ = ray_cluster
    shared = session_home / "shared"
    shared.mkdir(mode=0o1777, exist_ok=True)
    shared.chmod(0o1777)
    env = None
    if os.environ.get("AICLUSTER_TEST_STATE", "sqlite") == "postgresql":
        env = {"AICLUSTER_STATE": request.getfixturevalue("pg_server").create_database()}
    cp = ControlPlaneProc(session_home / "cp", cluster.address, free_port(), shared=shared, env=env)
    cp.start()
    yield cp
    cp.stop()


@pytest.fixture(scope="session")
def state_db(control_plane):
    """An SQLAlchemy engine on the session control plane's store, SQLite or PostgreSQL."""
    from sqlalchemy import create_engine

    from aicluster.store.db import state_url

    url = (control_plane.env or {}).get("AICLUSTER_STATE") or control_plane.home / "state.db"
    # pre-ping: a module restarts the session's PostgreSQL (a database restarted under load),
    # which kills the connections this pool holds from before
    engine = create_engine(state_url(url), pool_pre_ping=True)
    yield engine
    engine.dispose()


@pytest.fixture
def sqlite_state(control_plane) -> Path:
    """The session control plane's SQLite file, for tests that read it raw (skipped when
    the session runs on PostgreSQL)."""
    if os.environ.get("AICLUSTER_TEST_STATE", "sqlite") == "postgresql":
        pytest.skip("reads the SQLite file; this session's state is on PostgreSQL")
    return control_plane.home / "state.db"


@pytest.fixture
def shared_dir(control_plane, request) -> Path:
    """A fresh folder that jobs may write (a declared shared path), for tests that watch
    what jobs do from outside; jobs run sandboxed, so the test's own tmp_path is hidden."""
    path = Path(tempfile.mkdtemp(prefix=request.node.name[:40] + "-", dir=control_plane.shared))
    path.chmod(0o777)
    return path


@pytest.fixture(scope="session")
def admin(control_plane):
    return control_plane.client()


@pytest.fixture(scope="session")
def gpu_nodes(admin):
    return {n["node_id"]: n for n in admin.nodes() if n["pool"] == "gpu" and n["alive"]}


# A real PostgreSQL for the state-store tests (pg_server, pg_url, state_url).
pytest_plugins = ["pgserver"]
