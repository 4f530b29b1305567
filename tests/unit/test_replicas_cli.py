"""`aicluster up --join-control-plane` refuses what cannot work before starting anything:
a state that is not PostgreSQL, or a machine that is not in the cluster; the messages
name the option and show no traceback."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from aicluster.cli.main import app


@pytest.fixture
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("AICLUSTER_HOME", str(h))
    monkeypatch.delenv("AICLUSTER_STATE", raising=False)
    return h


def run(*args):
    return CliRunner().invoke(app, list(args))


def test_join_control_plane_needs_postgresql(home):
    result = run("up", "--join-control-plane", "--api-port", "18766")
    assert result.exit_code == 2, result.output
    assert "--join-control-plane: replicas share a PostgreSQL state database" in result.output
    assert "Traceback" not in result.output
    assert not (home / "platform.json").exists()


def test_join_control_plane_needs_a_ray_node_here(home, pg_url):
    result = run("up", "--join-control-plane", "--state", pg_url, "--api-port", "18766")
    assert result.exit_code == 2, result.output
    assert "run `aicluster join HEAD` here first" in " ".join(result.output.split())
    assert "Traceback" not in result.output
    assert json.loads((home / "state.json").read_text())["url"].startswith("postgresql")


def test_join_control_plane_refuses_an_unreachable_database(home):
    result = run("up", "--join-control-plane", "--state", "postgresql://u:secret@127.0.0.1:1/db")
    assert result.exit_code == 2
    assert "--state: cannot open the state store" in result.output
    assert "secret" not in result.output
