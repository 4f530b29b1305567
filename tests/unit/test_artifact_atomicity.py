"""Uploads are atomic and resumable, and concurrent pushes of one name both land.

Real processes: tests/artifact_worker.py pushes through the upload protocol; one
is killed with SIGKILL in the middle of a blob, two others push at the same moment.
Against a local folder and an S3-protocol server (moto).
"""

from __future__ import annotations

import os
import signal

from aicluster.artifacts import parse_ref

from artifact_support import (
    artifacts,
    home,
    make_tree,
    read_tree,
    s3_server,
    storage,
    worker,
)

FILES = 8
SIZE = 256 << 10  # 4 chunks of 64 KiB each


def test_killed_push_leaves_no_version_and_resumes(artifacts, home, storage, tmp_path):
    files = {f"shard-{i}.bin": os.urandom(SIZE) for i in range(FILES)}
    src = make_tree(tmp_path / "src", files)
    proc = worker("push", home, storage, str(src), "t/big", "--slow", "0.02")
    for line in proc.stdout:  # kill it in the middle of the 4th file
        if line.strip() == "chunk 14":
            os.kill(proc.pid, signal.SIGKILL)
            break
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert artifacts.index.get("t", "big") is None  # no visible version, no artifact
    present = artifacts.backend.present(artifacts.backend.list_blobs())
    assert 1 <= len(present) <= 3  # whole blobs only: the one being written is not there
    sent = []
    v = artifacts.push_folder(src, parse_ref("t/big"), "model", progress=sent.append)
    assert sum(sent) == (FILES - len(present)) * SIZE  # what was stored is not sent again
    assert v.version == 1
    assert read_tree(artifacts.pull(parse_ref("t/big:1"), tmp_path / "out")) == files
    artifacts.gc(upload_ttl_s=-1)  # the dead session expires; nothing referenced goes
    assert read_tree(artifacts.pull(parse_ref("t/big:1"), tmp_path / "out2")) == files


def test_concurrent_pushes_of_one_name_both_commit(artifacts, home, storage, tmp_path):
    common = os.urandom(SIZE)  # both write this blob at the same time
    trees = {
        who: make_tree(tmp_path / who, {"common.bin": common, "own.bin": os.urandom(SIZE)})
        for who in ("a", "b")
    }
    go = tmp_path / "go"
    procs = {
        who: worker("push", home, storage, str(src), "t/same", "--go", str(go))
        for who, src in trees.items()
    }
    go.touch()
    versions = {}
    for who, p in procs.items():
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        versions[who] = int(out.strip().splitlines()[-1].split()[1])
    assert sorted(versions.values()) == [1, 2]
    for who, version in versions.items():  # each version holds what its pusher sent
        got = artifacts.pull(parse_ref(f"t/same:{version}"), tmp_path / f"out-{who}")
        assert read_tree(got) == read_tree(trees[who])
    assert artifacts.resolve(parse_ref("t/same:latest")).version == 2
