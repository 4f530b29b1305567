"""Rules for declared uploads and the store's proof of possession, in process.

Path rules (control and format characters, lengths, a file that is also a folder),
size and count limits, version numbers past the column range, blobs counted as
stored only for a team that proved it holds them, verified reads before serving,
declared sizes checked when a blob is received and at commit.
"""

from __future__ import annotations

import hashlib
import os

import pytest

from aicluster.artifacts import ManifestError, RefError, parse_ref
from aicluster.artifacts.manifest import MAX_FILES, MAX_SIZE, check_files
from aicluster.artifacts.names import MAX_VERSION
from aicluster.store.artifacts import BlobCorrupt, MissingBlobs

from artifact_support import artifacts, home, make_tree, s3_server, storage

R = parse_ref


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def entry(path, size=1, digest=None):
    return {"path": path, "size": size, "sha256": digest or sha(path.encode("utf-8", "replace"))}


@pytest.mark.parametrize(
    "paths, says",
    [
        (["a\x00b"], r"files\[0\]: file path 'a\\x00b'"),
        (["ok", "bell\x07"], r"files\[1\]: file path 'bell\\x07'.*U\+0007"),
        (["tab\there"], r"'tab\\there'.*U\+0009"),
        (["\u202eexe.txt"], r"'\\u202eexe.txt'.*U\+202E"),
        (["zero\u200bwidth"], r"U\+200B"),
        (["line\u2028sep"], r"U\+2028"),
        (["x" * 1025], r"files\[0\]: file path 'x{80}\.\.\.': 1025 characters, at most 1024"),
        (["d/" + "n" * 256], r"the name 'n{40}\.\.\.' is over 255 bytes"),
        (["a", "a/b"], r"files\[1\]: file path 'a/b' needs a folder 'a'.*\(files\[0\]\)"),
        (["m/w.bin", "m/w.bin/x/y"], r"'m/w.bin/x/y' needs a folder 'm/w.bin'"),
        (["/etc/passwd"], r"file path '/etc/passwd': must be relative"),
        (["../up"], r"file path '../up': must be relative"),
        (["a//b"], r"file path 'a//b': must be relative"),
        (["same", "same"], r"files\[1\]: file 'same' is listed twice"),
    ],
)
def test_declared_paths_breaking_a_rule_are_refused_naming_them(paths, says):
    with pytest.raises(ManifestError, match=says):
        check_files([entry(p) for p in paths], strict=True)


def test_paths_that_are_fine_pass():
    ok = ["a/b", "a/c", "ab", "résumé/データ.txt", "n" * 255, "/".join(["d"] * 500)]
    assert [f.path for f in check_files([entry(p) for p in ok], strict=True)] == sorted(ok)


@pytest.mark.parametrize(
    "size, says",
    [
        (-1, "non-negative"),
        (MAX_SIZE + 1, f"over {MAX_SIZE}"),
        (1.5, "non-negative integer"),
        (True, "non-negative integer"),
        ("5", "non-negative integer"),
        (float("inf"), "integer"),
    ],
)
def test_declared_sizes_must_be_bounded_integers(size, says):
    with pytest.raises(ManifestError, match=rf"files\[0\] 'f': size.*{says}"):
        check_files([entry("f", size)], strict=True)


def test_one_sha256_one_size_and_a_bounded_total():
    d = sha(b"x")
    with pytest.raises(ManifestError, match=r"files\[1\] 'b': size 2 differs .* by 'a'"):
        check_files([entry("a", 1, d), entry("b", 2, d)], strict=True)
    with pytest.raises(ManifestError, match="total size is over"):
        check_files([entry("a", MAX_SIZE), entry("b", 1)], strict=True)


def test_the_file_count_is_capped():
    files = ({"path": f"f{i}", "size": 0, "sha256": "0" * 64} for i in range(MAX_FILES + 1))
    with pytest.raises(ManifestError, match=f"files: more than {MAX_FILES} files"):
        check_files(files, strict=True)


def test_reading_an_old_manifest_keeps_the_basic_rules_only():
    assert check_files([entry("a"), entry("a/b")])  # not strict: stays readable
    with pytest.raises(ManifestError, match="NUL"):
        check_files([entry("a\x00")])


@pytest.mark.parametrize("text", ["t/n:99999999999999999999", f"t/n:{MAX_VERSION + 1}"])
def test_versions_past_the_column_range_are_refused(text):
    with pytest.raises(RefError, match=rf"version '\d+.*': versions are at most {MAX_VERSION}"):
        parse_ref(text)


def test_non_ascii_digits_are_not_versions():
    for sel in ("²", "١٢"):  # str.isdigit says yes to both
        with pytest.raises(RefError, match="tag"):
            parse_ref(f"t/n:{sel}")
    assert parse_ref(f"t/n:{MAX_VERSION}").version == MAX_VERSION


def test_huge_selectors_resolve_to_nothing_in_the_index(artifacts, tmp_path):
    artifacts.push_folder(make_tree(tmp_path / "s", {"f": b"1"}), R("t/n"), "model")
    assert artifacts.index.resolve("t", "n", "99999999999999999999") is None
    assert artifacts.index.resolve("t", "n", "1").version == 1


# --- proof of possession ----------------------------------------------------------------


def test_another_teams_digest_is_missing_until_its_bytes_are_sent(artifacts, tmp_path):
    data = os.urandom(10_000)
    artifacts.push_folder(make_tree(tmp_path / "s", {"w": data}), R("t/secret"), "model")
    declared = [{"path": "w", "size": len(data), "sha256": sha(data)}]
    never = [{"path": "w", "size": 5, "sha256": sha(b"never stored")}]
    up, missing = artifacts.begin_upload(R("u/steal"), "model", declared, require_proof=True)
    _, missing_never = artifacts.begin_upload(R("u/probe"), "model", never, require_proof=True)
    assert missing == [sha(data)] and missing_never == [sha(b"never stored")]  # no oracle
    assert artifacts.missing(up.id, require_proof=True) == [sha(data)]
    with pytest.raises(MissingBlobs) as exc:
        artifacts.commit(up.id, require_proof=True)
    assert exc.value.digests == [sha(data)]
    assert artifacts.index.get("u", "steal") is None
    # the owner's own uploads still skip it
    _, own = artifacts.begin_upload(R("t/again"), "model", declared, require_proof=True)
    assert own == []
    # sending the bytes proves it (storage is content-addressed: same blob)
    assert artifacts.put_blob(up.id, sha(data), [data]) == len(data)
    assert artifacts.commit(up.id, require_proof=True).version == 1
    _, later = artifacts.begin_upload(R("u/later"), "model", declared, require_proof=True)
    assert later == []


def test_wrong_bytes_prove_nothing(artifacts, tmp_path):
    data = os.urandom(5000)
    artifacts.push_folder(make_tree(tmp_path / "s", {"w": data}), R("t/secret"), "model")
    declared = [{"path": "w", "size": len(data), "sha256": sha(data)}]
    up, _ = artifacts.begin_upload(R("u/steal"), "model", declared, require_proof=True)
    with pytest.raises(BlobCorrupt):
        artifacts.put_blob(up.id, sha(data), [os.urandom(len(data))])
    assert artifacts.index.proved("u", [sha(data)]) == set()
    with pytest.raises(MissingBlobs):
        artifacts.commit(up.id, require_proof=True)


def test_gc_forgets_proofs_of_deleted_blobs(artifacts, tmp_path):
    data = os.urandom(3000)
    artifacts.push_folder(make_tree(tmp_path / "s", {"w": data}), R("t/x"), "model")
    assert artifacts.index.proved("t", [sha(data)]) == {sha(data)}
    artifacts.delete_version(R("t/x:1"))
    assert artifacts.index.proved("t", [sha(data)]) == set()


# --- sizes and verified reads -------------------------------------------------------------


def test_more_bytes_than_declared_are_refused_naming_the_file(artifacts):
    data = b"0123456789"
    declared = [{"path": "dir/f.bin", "size": 4, "sha256": sha(data)}]
    up, missing = artifacts.begin_upload(R("t/sz"), "model", declared, require_proof=True)
    with pytest.raises(ManifestError, match=r"file 'dir/f.bin': received more than the 4 bytes"):
        artifacts.put_blob(up.id, missing[0], [data[:4], data[4:]])
    assert not artifacts.backend.exists(sha(data))


def test_commit_checks_stored_sizes_against_declared_ones(artifacts, tmp_path):
    data = os.urandom(2000)
    artifacts.push_folder(make_tree(tmp_path / "s", {"w": data}), R("t/a"), "model")
    declared = [{"path": "renamed", "size": len(data) + 7, "sha256": sha(data)}]
    up, missing = artifacts.begin_upload(R("t/b"), "model", declared, require_proof=True)
    assert missing == []
    with pytest.raises(ManifestError, match=rf"file 'renamed': declared size {len(data) + 7}"):
        artifacts.commit(up.id, require_proof=True)
    assert artifacts.index.get("t", "b") is None


@pytest.mark.parametrize("size", [1000, 3 << 20])
def test_open_blob_hashes_before_it_returns(artifacts, tmp_path, size):
    data = os.urandom(size)
    v = artifacts.push_folder(make_tree(tmp_path / "s", {"w": data}), R("t/r"), "model")
    digest = artifacts.manifest(v).files[0].sha256
    n, chunks = artifacts.backend.open_verified(digest, spool_max=1 << 20)
    assert n == size and b"".join(chunks) == data
    if not artifacts.backend.local:
        return
    path = artifacts.backend.blob_path(digest)
    os.chmod(path, 0o644)
    with open(path, "wb") as f:
        f.write(os.urandom(size))
    with pytest.raises(BlobCorrupt, match="is corrupt: its bytes do not match sha256"):
        artifacts.backend.open_verified(digest, spool_max=1 << 20)
