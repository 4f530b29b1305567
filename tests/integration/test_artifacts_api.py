"""Artifacts through the real control plane: the CLI and SDK over HTTP.

Push/pull round trips with hash checks, resume, tags, delete, team isolation
(another team gets 404, never 403, until the artifact is shared), viewers.
"""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from aicluster.cli.main import app
from aicluster.client import artifacts as arts
from aicluster.client.api import ApiError

from artifact_support import make_tree, read_tree


@pytest.fixture(scope="module")
def users(admin):
    for name in ("art-a", "art-b"):
        if name not in admin.teams():
            admin.create_team(name)
    return {
        "a": admin.create_token("art-alice", team="art-a")["token"],
        "b": admin.create_token("art-bob", team="art-b")["token"],
        "viewer": admin.create_token("art-vera", team="art-a", role="viewer")["token"],
    }


def cli(control_plane, token, *args):
    res = CliRunner().invoke(
        app, ["artifacts", *args, "--url", control_plane.url, "--token", token]
    )
    return res.exit_code, res.stdout, res.stderr


def test_cli_push_pull_round_trip(control_plane, users, tmp_path):
    files = {
        "weights/a.bin": os.urandom(3 << 20),
        "weights/b.bin": os.urandom(1000),
        "copy-of-b.bin": b"",
        "config.json": b'{"layers": 2}',
    }
    files["copy-of-b.bin"] = files["weights/b.bin"]
    src = make_tree(tmp_path / "model", files)
    code, out, err = cli(control_plane, users["a"], "push", str(src), "llm", "-o", "json")
    assert code == 0, err
    v = json.loads(out)
    assert (v["ref"], v["file_count"], v["tags"]) == ("art-a/llm:1", 4, ["latest"])
    code, out, err = cli(
        control_plane, users["a"], "pull", "art-a/llm:latest", str(tmp_path / "out")
    )
    assert code == 0, err
    assert read_tree(tmp_path / "out") == files
    code, out, _ = cli(control_plane, users["a"], "describe", "llm:1", "-o", "json")
    d = json.loads(out)
    assert {f["path"] for f in d["files"]} == set(files)
    code, out, _ = cli(control_plane, users["a"], "ls", "-o", "json")
    assert [a["name"] for a in json.loads(out)] == ["llm"]
    code, _, err = cli(control_plane, users["a"], "pull", "llm", str(tmp_path / "out"))
    assert code == 1 and "DEST" in err and "already exists" in err


def test_tags_delete_and_clear_errors(control_plane, users, tmp_path):
    c = control_plane.client(users["a"])
    src = make_tree(tmp_path / "s", {"f": b"one"})
    arts.push(c, src, "ckpt", "checkpoint")
    arts.push(c, make_tree(tmp_path / "s2", {"f": b"two"}), "ckpt:good", "checkpoint")
    assert cli(control_plane, users["a"], "tag", "ckpt:1", "first")[0] == 0
    d = arts.describe(c, "ckpt")
    assert d["tags"] == {"first": 1, "good": 2, "latest": 2}
    code, out, _ = cli(control_plane, users["a"], "rm", "ckpt:good")
    assert code == 0 and "art-a/ckpt:2" in out
    assert arts.describe(c, "ckpt")["tags"] == {"first": 1, "latest": 1}
    for args, says in [
        (("rm", "ckpt"), "name the version"),
        (("push", str(src), "ckpt", "--kind", "model"), "--kind"),
        (("push", str(src), "Bad!"), "artifact name"),
        (("push", str(tmp_path / "nope"), "x"), "PATH"),
        (("pull", "ckpt:9", str(tmp_path / "o")), "not found"),
        (("tag", "ckpt", "latest"), "reserved"),
    ]:
        code, _, err = cli(control_plane, users["a"], *args)
        assert code == 1 and says in err and "Traceback" not in err, (args, err)


def test_resume_sends_only_missing_blobs(control_plane, users, tmp_path):
    c = control_plane.client(users["a"])
    files = {f"part-{i}": os.urandom(100_000) for i in range(5)}
    src = make_tree(tmp_path / "d", files)
    from aicluster.artifacts import scan_folder

    scanned = scan_folder(src)
    up = c.request_json(
        "POST",
        "/v1/artifacts/uploads",
        json={"name": "data", "kind": "dataset", "files": [e.__dict__ for e, _ in scanned]},
    )
    for e, p in scanned[:2]:  # an upload that stops after two files
        arts.put_blob(c, up["upload_id"], e.sha256, p)
    with pytest.raises(ApiError) as exc:
        c.request_json("POST", f"/v1/artifacts/uploads/{up['upload_id']}/commit")
    assert exc.value.status_code == 409 and len(exc.value.detail["missing"]) == 3
    assert arts.list_artifacts(c) and "data" not in {a["name"] for a in arts.list_artifacts(c)}
    plan = []
    v = arts.push(c, src, "data", "dataset", on_plan=lambda n, b: plan.append((n, b)))
    assert plan == [(3, 300_000)] and v["version"] == 1
    _, path = arts.pull(c, "data", tmp_path / "out")
    assert read_tree(path) == files


def test_team_isolation_and_sharing(control_plane, users, tmp_path):
    alice, bob = control_plane.client(users["a"]), control_plane.client(users["b"])
    viewer = control_plane.client(users["viewer"])
    arts.push(alice, make_tree(tmp_path / "s", {"secret": b"top"}), "private", "dataset")
    assert "private" not in {a["name"] for a in arts.list_artifacts(bob)}
    for call in (
        lambda: arts.describe(bob, "art-a/private"),
        lambda: arts.pull(bob, "art-a/private:1", tmp_path / "x"),
        lambda: arts.tag(bob, "art-a/private", "mine"),
        lambda: arts.delete(bob, "art-a/private:1"),
        lambda: arts.share(bob, "art-a/private", "art-b"),
    ):
        with pytest.raises(ApiError) as exc:
            call()
        assert exc.value.status_code == 404 and "not found" in exc.value.message
    with pytest.raises(ApiError) as exc:
        arts.push(bob, tmp_path / "s", "art-a/intruder", "dataset")
    assert exc.value.status_code == 403
    with pytest.raises(ApiError) as exc:  # a viewer reads but cannot write
        arts.push(viewer, tmp_path / "s", "private", "dataset")
    assert exc.value.status_code == 403
    assert read_tree(arts.pull(viewer, "art-a/private", tmp_path / "v")[1]) == {"secret": b"top"}

    arts.share(alice, "private", "art-b")
    assert "private" in {a["name"] for a in arts.list_artifacts(bob)}
    assert read_tree(arts.pull(bob, "art-a/private", tmp_path / "b")[1]) == {"secret": b"top"}
    with pytest.raises(ApiError) as exc:  # shared is read-only
        arts.delete(bob, "art-a/private:1")
    assert exc.value.status_code == 403


def test_corrupt_blob_fails_the_pull(control_plane, users, tmp_path):
    c = control_plane.client(users["a"])
    data = os.urandom(200_000)
    v = arts.push(c, make_tree(tmp_path / "s", {"w": data}), "rot", "model")
    blob = next(
        (control_plane.home / "artifacts" / "blobs").rglob(
            arts.version(c, "rot")["files"][0]["sha256"]
        )
    )
    os.chmod(blob, 0o644)
    blob.write_bytes(data[:-1] + b"\0" if data[-1] else data[:-1] + b"\1")
    code, _, err = cli(
        control_plane, users["a"], "pull", f"rot:{v['version']}", str(tmp_path / "o")
    )
    assert code == 1 and "do not match sha256" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_pull_through_a_node_cache(control_plane, users, tmp_path):
    from aicluster.runtime.cache import BlobCache

    c = control_plane.client(users["a"])
    files = {"a": os.urandom(50_000), "b": os.urandom(50_000)}
    arts.push(c, make_tree(tmp_path / "s", files), "served", "model")
    cache = BlobCache(tmp_path / "cache", 1 << 30)
    plans = []
    for dest in ("r1", "r2"):
        _, path = arts.pull(
            c, "served", tmp_path / dest, cache=cache, on_plan=lambda n, b: plans.append(n)
        )
        assert read_tree(path) == files
    assert plans == [2, 0]  # the second replica on the node pulls nothing
