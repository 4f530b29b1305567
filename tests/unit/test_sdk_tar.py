"""The working_dir tarball: what is packed, what is skipped, and that it round-trips
through the worker's own extractor (tarfile "data" filter)."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from aicluster.client.api import Client, WorkdirError, pack_workdir
from aicluster.runtime.worker import extract_workdir
from aicluster.specs import SpecError


def make_tree(root: Path) -> None:
    files = {
        "train.py": "print('hi')\n",
        "pkg/__init__.py": "",
        "pkg/model.py": "X = 1\n",
        "data/nested/deep.txt": "deep\n",
        "checkpoints.txt": "a file, not the folder\n",
        # excluded:
        ".git/HEAD": "ref: refs/heads/main\n",
        "pkg/__pycache__/model.cpython-311.pyc": "bytecode",
        ".venv/bin/python": "venv",
        "checkpoints/step-1.pt": "weights",
        "data/checkpoints/step-2.pt": "weights",
    }
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    (root / "empty").mkdir()
    (root / "run.sh").write_text("#!/bin/sh\necho run\n")
    (root / "run.sh").chmod(0o755)


def names(blob: bytes) -> set[str]:
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        return set(tar.getnames())


def test_included_and_excluded(tmp_path: Path) -> None:
    make_tree(tmp_path)
    got = names(pack_workdir(tmp_path))
    assert got == {
        "train.py",
        "run.sh",
        "checkpoints.txt",
        "empty",
        "pkg",
        "pkg/__init__.py",
        "pkg/model.py",
        "data",
        "data/nested",
        "data/nested/deep.txt",
    }
    assert not any(n.startswith(("/", "./")) for n in got)


def test_round_trip_through_worker_extractor(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_tree(src)
    dest = tmp_path / "dest"
    extract_workdir(pack_workdir(src), dest)
    assert (dest / "train.py").read_text() == "print('hi')\n"
    assert (dest / "pkg/model.py").read_text() == "X = 1\n"
    assert (dest / "data/nested/deep.txt").read_text() == "deep\n"
    assert (dest / "empty").is_dir()
    assert os.access(dest / "run.sh", os.X_OK)
    for skipped in (".git", ".venv", "checkpoints", "pkg/__pycache__", "data/checkpoints"):
        assert not (dest / skipped).exists(), skipped


def test_symlinks_inside_kept_outside_dropped(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_tree(src)
    outside = tmp_path / "secret.txt"
    outside.write_text("secret")
    (src / "link-in").symlink_to("pkg/model.py")
    (src / "link-abs-in").symlink_to(src / "train.py")
    (src / "link-out").symlink_to(outside)
    (src / "dirlink").symlink_to(src / "data")
    dest = tmp_path / "dest"
    extract_workdir(pack_workdir(src), dest)
    assert (dest / "link-in").read_text() == "X = 1\n"
    assert (dest / "link-abs-in").is_symlink()
    assert not os.path.isabs(os.readlink(dest / "link-abs-in"))
    assert (dest / "link-abs-in").read_text() == "print('hi')\n"
    assert (dest / "dirlink").is_symlink() and (dest / "dirlink/nested/deep.txt").exists()
    assert not (dest / "link-out").exists() and not (dest / "link-out").is_symlink()


def test_deterministic(tmp_path: Path) -> None:
    make_tree(tmp_path)
    assert pack_workdir(tmp_path) == pack_workdir(tmp_path)


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(WorkdirError, match="not found"):
        pack_workdir(tmp_path / "missing")
    (tmp_path / "f").write_text("x")
    with pytest.raises(WorkdirError, match="not a folder"):
        pack_workdir(tmp_path / "f")
    (tmp_path / "big.bin").write_bytes(os.urandom(64 * 1024))
    with pytest.raises(WorkdirError, match="larger than"):
        pack_workdir(tmp_path, limit=16 * 1024)


def test_submit_file_missing_working_dir_is_spec_error(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("kind: job\nname: demo\ncommand: x\n\nworking_dir: nope\n")
    # Checked before any request: the port is closed and is never contacted.
    with Client("http://127.0.0.1:9", "tok") as client, pytest.raises(SpecError) as info:
        client.submit_file(spec)
    (issue,) = info.value.issues
    assert issue.field == "working_dir" and issue.line == 5 and "not found" in issue.message
