"""Per-team storage quotas in the artifact store, on SQLite and PostgreSQL.

An upload past the quota is refused when declared (no session, no blob stored) and when
committed (the session discarded); bytes the team already keeps count once, bytes of
another team count in full (the refusal is the same whether or not another team holds
them); concurrent commits of one team never take it past its quota together; deleting
versions and collecting garbage frees room; usage reports the quota.
"""

from __future__ import annotations

import os
import threading

import pytest

from aicluster.artifacts import parse_ref
from aicluster.artifacts.manifest import scan_folder
from aicluster.store import open_store
from aicluster.store.artifacts import ArtifactStore, StorageConfig
from aicluster.store.artifacts.quotas import StorageQuotaExceeded
from aicluster.store.errors import NotFound

from artifact_support import make_tree

R = parse_ref
KB = 1000


@pytest.fixture
def store(state_url):
    st = open_store(state_url)
    for team in ("t", "u"):
        st.ensure_team(team)
    yield st
    st.close()


@pytest.fixture
def repo(store, tmp_path):
    return ArtifactStore.open(store, tmp_path / "home", StorageConfig(url=str(tmp_path / "blobs")))


def tree(tmp_path, name: str, **files: bytes):
    return make_tree(tmp_path / name, dict(files))


def entries(path):
    return [e for e, _ in scan_folder(path)]


def used(repo, team: str = "t") -> int:
    return repo.usage(team).get(team, {}).get("bytes", 0)


def test_set_read_and_clear(repo):
    assert repo.index.quotas.get("t") is None
    q = repo.index.quotas.set("t", 5 * KB, actor="root")
    assert (q.team, q.max_bytes, q.updated_by) == ("t", 5 * KB, "root")
    assert repo.index.quotas.set("t", 7 * KB).max_bytes == 7 * KB  # replaced
    assert set(repo.index.quotas.all()) == {"t"}
    with pytest.raises(NotFound, match="nope"):
        repo.index.quotas.set("nope", 1)
    with pytest.raises(ValueError, match="-1"):
        repo.index.quotas.set("t", -1)
    assert repo.index.quotas.clear("t") and not repo.index.quotas.clear("t")
    assert repo.index.quotas.get("t") is None


def test_an_upload_past_the_quota_is_refused_before_anything_is_stored(repo, tmp_path):
    repo.index.quotas.set("t", 20 * KB)
    first = repo.push_folder(tree(tmp_path, "a", w=os.urandom(10 * KB)), R("t/m"), "model")
    before, blobs = used(repo), set(repo.backend.list_blobs())
    assert 10 * KB < before < 12 * KB  # the blob and its manifest
    big = tree(tmp_path, "b", w=os.urandom(15 * KB))
    with pytest.raises(StorageQuotaExceeded) as exc:
        repo.begin_upload(R("t/m"), "model", entries(big))
    e = exc.value
    assert (e.team, e.quota_bytes, e.used_bytes) == ("t", 20 * KB, before)
    assert 15 * KB < e.requested_bytes < 17 * KB
    assert "storage quota of team 't'" in str(e) and e.detail()["field"] == "quota"
    assert repo.index.upload_ids() == set() and set(repo.backend.list_blobs()) == blobs
    assert [v.version for v in repo.index.versions("t", "m")] == [first.version]
    # another team has no quota: its upload is not limited by t's
    repo.push_folder(big, R("u/m"), "model")


def test_bytes_the_team_keeps_count_once_and_another_teams_in_full(repo, tmp_path):
    data = os.urandom(10 * KB)
    src = tree(tmp_path, "a", w=data)
    repo.push_folder(src, R("t/m"), "model")
    repo.index.quotas.set("t", used(repo) + 2 * KB)
    v2 = repo.push_folder(src, R("t/other"), "model")  # same bytes: only a manifest more
    assert v2.version == 1
    # u's quota is below the bytes t keeps; that t keeps them does not help u
    repo.index.quotas.set("u", 5 * KB)
    with pytest.raises(StorageQuotaExceeded) as held_elsewhere:
        repo.begin_upload(R("u/m"), "model", entries(src))
    fresh = tree(tmp_path, "f", w=os.urandom(10 * KB))
    with pytest.raises(StorageQuotaExceeded) as held_nowhere:
        repo.begin_upload(R("u/m"), "model", entries(fresh))
    a, b = held_elsewhere.value, held_nowhere.value
    assert (
        (a.used_bytes, a.requested_bytes)
        == (b.used_bytes, b.requested_bytes)
        == (0, b.requested_bytes)
    )
    assert str(a) == str(b)  # the answer tells nothing about who holds the content


def test_a_commit_rechecks_and_discards_the_upload_it_refuses(repo, tmp_path):
    repo.index.quotas.set("t", 20 * KB)
    one, two = (tree(tmp_path, n, w=os.urandom(12 * KB)) for n in ("a", "b"))
    ups = []
    for src in (one, two):  # each fits alone: both are declared
        up, missing = repo.begin_upload(R("t/ck"), "checkpoint", entries(src))
        for d in missing:
            repo.put_blob(up.id, d, [(src / "w").read_bytes()])
        ups.append(up)
    assert repo.commit(ups[0].id).version == 1
    with pytest.raises(StorageQuotaExceeded) as exc:
        repo.commit(ups[1].id)
    assert exc.value.used_bytes == used(repo) and used(repo) <= 20 * KB
    assert repo.index.get_upload(ups[1].id) is None  # discarded
    assert [v.version for v in repo.index.versions("t", "ck")] == [1]
    assert repo.gc().deleted == 1  # the refused upload's blob


def test_concurrent_commits_never_pass_the_quota_together(repo, tmp_path):
    size, n = 8 * KB, 6
    repo.index.quotas.set("t", 3 * size + 3 * 1500)  # three fit, with their manifests
    ups = []
    for i in range(n):
        src = tree(tmp_path, f"s{i}", w=os.urandom(size))
        # one artifact each: nothing but the team's quota row makes their commits wait
        up, missing = repo.begin_upload(R(f"t/ck{i}"), "checkpoint", entries(src))
        repo.put_blob(up.id, missing[0], [(src / "w").read_bytes()])
        ups.append(up)
    results: list = [None] * n
    go = threading.Barrier(n)

    def commit(i: int) -> None:
        go.wait()
        try:
            results[i] = repo.commit(ups[i].id)
        except StorageQuotaExceeded as exc:
            results[i] = exc

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    refused = [r for r in results if isinstance(r, StorageQuotaExceeded)]
    assert len(refused) == n - 3, results
    assert used(repo) <= 3 * size + 3 * 1500
    assert sum(len(repo.index.versions("t", f"ck{i}")) for i in range(n)) == 3


def test_deleting_versions_and_collecting_frees_room(repo, tmp_path):
    repo.index.quotas.set("t", 15 * KB)
    repo.push_folder(tree(tmp_path, "a", w=os.urandom(10 * KB)), R("t/m"), "model")
    nxt = tree(tmp_path, "b", w=os.urandom(10 * KB))
    with pytest.raises(StorageQuotaExceeded):
        repo.push_folder(nxt, R("t/m"), "model")
    repo.delete_version(R("t/m:1"))  # collects the blobs no version names
    assert used(repo) == 0
    assert repo.push_folder(nxt, R("t/m"), "model").version == 2
    # a quota lowered below what the team keeps deletes nothing; it refuses what adds bytes
    repo.index.quotas.set("t", 1)
    assert used(repo) > 1 and len(repo.index.versions("t", "m")) == 1
    with pytest.raises(StorageQuotaExceeded):
        repo.begin_upload(R("t/m"), "model", entries(nxt))


class Rank0:
    """The engine's side of a job's outputs (engine.protocol): what rank 0 left, and the
    blobs its node was asked to write."""

    def __init__(self, files: list[dict]):
        self.files, self.written = files, []

    def scan_output(self, job_id: str, attempt: int, path: str) -> list[dict]:
        return self.files

    def upload_output(self, job_id, attempt, path, digests, storage) -> int:
        self.written.append(list(digests))
        return 0


def test_a_jobs_output_past_the_quota_fails_before_its_node_writes(store, repo, tmp_path):
    from aicluster.control.artifacts import ArtifactService
    from aicluster.control.job_io import push_outputs
    from aicluster.specs.job import JobSpec

    store.create_user("ann", "t", "member")
    out = [{"path": "out", "artifact": "final"}]
    spec = JobSpec(name="train", team="t", command="true", outputs=out)
    job = store.create_job(spec, "ann")
    repo.index.quotas.set("t", 5 * KB)
    node = Rank0([e.as_dict() for e in entries(tree(tmp_path, "o", w=os.urandom(8 * KB)))])
    with pytest.raises(StorageQuotaExceeded) as exc:
        push_outputs(job, node, ArtifactService(repo), tmp_path / "home")
    assert node.written == [] and repo.index.upload_ids() == set()
    # what the jobs loop records as the job's failure (control.jobs_loop: output_failed)
    said = f"{type(exc.value).__name__}: {exc.value}"
    assert said.startswith("StorageQuotaExceeded: storage quota of team 't' exceeded")
