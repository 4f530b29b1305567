"""Client config precedence: explicit > environment > AICLUSTER_HOME files > default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aicluster.cli.config import DEFAULT_URL, home_dir, load_client_config


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("AICLUSTER_HOME", str(h))
    monkeypatch.delenv("AICLUSTER_URL", raising=False)
    monkeypatch.delenv("AICLUSTER_TOKEN", raising=False)
    return h


def write_files(home: Path, url: str = "http://files:1", token: str = "file-token") -> None:
    (home / "client.json").write_text(json.dumps({"url": url}))
    (home / "admin.token").write_text(token + "\n")


def test_defaults_without_env_or_files(home: Path) -> None:
    cfg = load_client_config()
    assert cfg.url == DEFAULT_URL == "http://127.0.0.1:8765"
    assert cfg.token is None


def test_files_used_when_no_env(home: Path) -> None:
    write_files(home)
    cfg = load_client_config()
    assert (cfg.url, cfg.token) == ("http://files:1", "file-token")


def test_env_beats_files(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_files(home)
    monkeypatch.setenv("AICLUSTER_URL", "http://env:2")
    monkeypatch.setenv("AICLUSTER_TOKEN", "env-token")
    cfg = load_client_config()
    assert (cfg.url, cfg.token) == ("http://env:2", "env-token")


def test_explicit_beats_env_and_files(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_files(home)
    monkeypatch.setenv("AICLUSTER_URL", "http://env:2")
    monkeypatch.setenv("AICLUSTER_TOKEN", "env-token")
    cfg = load_client_config(url="http://arg:3", token="arg-token")
    assert (cfg.url, cfg.token) == ("http://arg:3", "arg-token")


def test_url_and_token_resolved_independently(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_files(home)
    monkeypatch.setenv("AICLUSTER_TOKEN", "env-token")
    cfg = load_client_config(url="http://arg:3")
    assert (cfg.url, cfg.token) == ("http://arg:3", "env-token")
    monkeypatch.delenv("AICLUSTER_TOKEN")
    monkeypatch.setenv("AICLUSTER_URL", "http://env:2")
    cfg = load_client_config()
    assert (cfg.url, cfg.token) == ("http://env:2", "file-token")


def test_empty_env_counts_as_unset(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_files(home)
    monkeypatch.setenv("AICLUSTER_URL", "")
    monkeypatch.setenv("AICLUSTER_TOKEN", "")
    cfg = load_client_config()
    assert (cfg.url, cfg.token) == ("http://files:1", "file-token")


def test_broken_files_fall_back(home: Path) -> None:
    (home / "client.json").write_text("{not json")
    (home / "admin.token").write_text("\n\n")
    cfg = load_client_config()
    assert (cfg.url, cfg.token) == (DEFAULT_URL, None)
    (home / "client.json").write_text(json.dumps(["not", "a", "mapping"]))
    assert load_client_config().url == DEFAULT_URL
    (home / "client.json").write_text(json.dumps({"port": 1}))
    assert load_client_config().url == DEFAULT_URL


def test_token_file_first_line_stripped(home: Path) -> None:
    (home / "admin.token").write_text("  tok-123  \nsecond line\n")
    assert load_client_config().token == "tok-123"


def test_url_normalized(home: Path) -> None:
    assert load_client_config(url="http://h:1/").url == "http://h:1"
    assert load_client_config(url="10.0.0.5:8765").url == "http://10.0.0.5:8765"
    assert load_client_config(url="https://h").url == "https://h"


def test_home_dir_env_and_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AICLUSTER_HOME", str(tmp_path / "x"))
    assert home_dir() == tmp_path / "x"
    monkeypatch.setenv("AICLUSTER_HOME", "~/custom-home")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert home_dir() == tmp_path / "custom-home"
    monkeypatch.delenv("AICLUSTER_HOME")
    assert home_dir() == tmp_path / ".aicluster"


def test_home_dir_default_reads_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AICLUSTER_HOME", raising=False)
    monkeypatch.delenv("AICLUSTER_URL", raising=False)
    monkeypatch.delenv("AICLUSTER_TOKEN", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".aicluster").mkdir()
    write_files(tmp_path / ".aicluster", url="http://default-home:9", token="dh")
    cfg = load_client_config()
    assert (cfg.url, cfg.token) == ("http://default-home:9", "dh")
