"""Artifact hardening against a member of another team, through the real control plane.

Each test sends the exact hostile input over HTTP and expects a 4xx whose JSON
`detail.message` names the field or path, nothing stored, and listings working
afterwards: dedup by digest without the bytes, tampered blobs served, declared
sizes, path rules, another team's producer_job, version numbers past 2^63, and
the error statuses every artifact route declares in OpenAPI.
"""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from aicluster.artifacts.manifest import MAX_FILES
from aicluster.client import artifacts as arts
from aicluster.client.api import ApiError

from artifact_support import make_tree, read_tree

UPLOADS = "/v1/artifacts/uploads"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def users(admin):
    for name in ("hard-a", "hard-b"):
        if name not in admin.teams():
            admin.create_team(name)
    return {
        "a": admin.create_token("hard-alice", team="hard-a")["token"],
        "b": admin.create_token("hard-bob", team="hard-b")["token"],
    }


@pytest.fixture
def alice(control_plane, users):
    with control_plane.client(users["a"]) as c:
        yield c


@pytest.fixture
def bob(control_plane, users):
    with control_plane.client(users["b"]) as c:
        yield c


def names(client) -> set[str]:
    return {a["name"] for a in arts.list_artifacts(client)}


def refused(resp, status: int, *says: str) -> dict:
    """The response is `status` with an ErrorBody whose message contains every `says`."""
    assert resp.status_code == status, (resp.status_code, resp.text[:500])
    detail = resp.json()["detail"]
    for s in says:
        assert s in detail["message"], (s, detail["message"])
    return detail


def begin(client, name: str, files: list[dict], **extra):
    body = {"name": name, "kind": "model", "files": files, **extra}
    # json.dumps escapes what httpx's encoder cannot send (a lone surrogate, as \\ud800)
    return client.send(
        "POST",
        UPLOADS,
        content=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )


def one_file(data: bytes, path: str = "w.bin") -> list[dict]:
    return [{"path": path, "size": len(data), "sha256": sha(data)}]


# --- 1. dedup needs the bytes, not just the digest --------------------------------------


def test_another_teams_digest_is_missing_and_cannot_be_committed(alice, bob, tmp_path):
    secret = os.urandom(40_000)
    arts.push(alice, make_tree(tmp_path / "a", {"w.bin": secret}), "hb-secret", "model")
    before = names(bob)
    up = begin(bob, "hb-steal", one_file(secret))
    assert up.status_code == 201, up.text
    up = up.json()
    assert up["missing"] == [sha(secret)]  # as if nobody had it
    probe = begin(bob, "hb-probe", one_file(b"stored nowhere")).json()
    assert probe["missing"] == [sha(b"stored nowhere")]  # the same answer: no oracle
    got = bob.send("GET", f"{UPLOADS}/{up['upload_id']}").json()
    assert got["missing"] == [sha(secret)]
    commit = bob.send("POST", f"{UPLOADS}/{up['upload_id']}/commit")
    detail = refused(commit, 409, "missing")
    assert detail["missing"] == [sha(secret)]
    wrong = bob.send(
        "PUT", f"{UPLOADS}/{up['upload_id']}/blobs/{sha(secret)}", content=os.urandom(len(secret))
    )
    refused(wrong, 400, sha(secret))
    refused(bob.send("POST", f"{UPLOADS}/{up['upload_id']}/commit"), 409, "missing")
    assert names(bob) == before and "hb-steal" not in names(bob)
    with pytest.raises(ApiError) as exc:
        arts.pull(bob, "hard-b/hb-steal", tmp_path / "stolen")
    assert exc.value.status_code == 404 and not (tmp_path / "stolen").exists()
    # alice's own next push still dedups; bob's listings still work
    plan = []
    arts.push(
        alice,
        make_tree(tmp_path / "a2", {"copy.bin": secret}),
        "hb-secret",
        "model",
        on_plan=lambda n, b: plan.append(n),
    )
    assert plan == [0]
    assert "hb-secret" not in names(bob)


def test_a_team_that_holds_the_bytes_may_push_them_too(alice, bob, tmp_path):
    shared = os.urandom(20_000)
    arts.push(alice, make_tree(tmp_path / "a", {"f": shared}), "hb-common", "dataset")
    plan = []
    v = arts.push(
        bob,
        make_tree(tmp_path / "b", {"f": shared}),
        "hb-common",
        "dataset",
        on_plan=lambda n, b: plan.append(n),
    )
    assert plan == [1] and v["team"] == "hard-b"  # sent (proved), then stored once
    assert read_tree(arts.pull(bob, "hb-common", tmp_path / "out")[1]) == {"f": shared}


# --- 2. a tampered blob is never served -------------------------------------------------------


@pytest.mark.parametrize("size", [50_000, 20 << 20])  # served from memory / streamed twice
def test_tampered_blob_answers_409_without_its_bytes(control_plane, alice, tmp_path, size):
    data = os.urandom(size)
    name = f"hb-rot-{size}"
    v = arts.push(alice, make_tree(tmp_path / "s", {"w": data}), name, "model")
    digest = sha(data)
    blob = control_plane.home / "artifacts" / "blobs" / digest[:2] / digest
    os.chmod(blob, 0o644)
    evil = b"EVIL" + os.urandom(size - 4)
    blob.write_bytes(evil)
    url = f"/v1/artifacts/hard-a/{name}/versions/{v['version']}/blobs/{digest}"
    resp = alice.send("GET", url)
    refused(resp, 409, "corrupt", digest)
    assert b"EVIL" not in resp.content and len(resp.content) < 1000
    assert name in names(alice)


# --- 3. declared sizes ----------------------------------------------------------------------


def test_declared_size_is_checked_when_the_blob_arrives(alice, tmp_path):
    data = os.urandom(10_000)
    for declared in (len(data) - 1, len(data) + 1):
        up = begin(
            alice, "hb-size", [{"path": "weights/part.bin", "size": declared, "sha256": sha(data)}]
        ).json()
        put = alice.send("PUT", f"{UPLOADS}/{up['upload_id']}/blobs/{sha(data)}", content=data)
        refused(put, 400, "'weights/part.bin'", str(declared))
        refused(alice.send("POST", f"{UPLOADS}/{up['upload_id']}/commit"), 409, "missing")
    assert "hb-size" not in names(alice)


def test_declared_size_is_checked_at_commit(alice, tmp_path):
    data = os.urandom(8_000)
    arts.push(alice, make_tree(tmp_path / "s", {"w": data}), "hb-size-src", "model")
    up = begin(alice, "hb-size2", [{"path": "lies.bin", "size": 1, "sha256": sha(data)}]).json()
    assert up["missing"] == []  # alice holds it: dedup'd
    commit = alice.send("POST", f"{UPLOADS}/{up['upload_id']}/commit")
    refused(commit, 400, "'lies.bin'", "declared size 1", f"has {len(data)} bytes")
    assert "hb-size2" not in names(alice)


# --- 4. path rules, sizes and counts at begin -------------------------------------------------


@pytest.mark.parametrize(
    "paths, status, says",
    [
        (["a\x00b"], 400, ["files[0]", "'a\\x00b'"]),
        (["ok.txt", "esc\x1b[31m"], 400, ["files[1]", "U+001B"]),
        (["\u202etxt.exe"], 400, ["'\\u202etxt.exe'", "U+202E"]),
        (["\ud800"], 400, ["'\\ud800'"]),
        (["p" * 1025], 400, ["files[0]", "1025 characters, at most 1024"]),
        (["d/" + "n" * 256], 400, ["is over 255 bytes"]),
        (["model", "model/weights.bin"], 400, ["'model/weights.bin'", "folder 'model'"]),
        (["/etc/passwd"], 400, ["'/etc/passwd'", "relative"]),
        (["../../outside"], 400, ["'../../outside'", "relative"]),
    ],
)
def test_bad_paths_are_refused_at_begin(alice, paths, status, says):
    before = names(alice)
    files = [
        {"path": p, "size": 1, "sha256": sha(p.encode("utf-8", "surrogatepass"))} for p in paths
    ]
    refused(begin(alice, "hb-paths", files), status, *says)
    assert names(alice) == before


@pytest.mark.parametrize(
    "size, says",
    [
        (-1, "files.0.size"),
        (2**63, "files.0.size"),
        (99999999999999999999999, "files.0.size"),
        (1.5, "files.0.size"),
        ("7", "files.0.size"),
        (True, "files.0.size"),
    ],
)
def test_bad_sizes_are_refused_at_begin(alice, size, says):
    files = [{"path": "f", "size": size, "sha256": sha(b"f")}]
    detail = refused(begin(alice, "hb-sizes", files), 422, says)
    assert detail["issues"][0]["field"] == "files.0.size"
    assert "hb-sizes" not in names(alice)


def test_non_finite_metadata_and_too_many_files_are_refused(alice):
    resp = alice.send(
        "POST",
        UPLOADS,
        content=b'{"name": "hb-meta", "files": [], "metadata": {"loss": NaN}}',
        headers={"Content-Type": "application/json"},
    )
    refused(resp, 400, "metadata")
    files = [{"path": f"f{i}", "size": 0, "sha256": "0" * 64} for i in range(MAX_FILES + 1)]
    refused(begin(alice, "hb-many", files), 422, "files")
    assert not {"hb-meta", "hb-many"} & names(alice)


# --- 5. producer_job --------------------------------------------------------------------------


def test_producer_job_must_be_a_job_of_the_uploaders_team(alice, bob, tmp_path):
    job_b = bob.submit({"kind": "job", "name": "hb-job", "team": "hard-b", "command": "true"}, None)
    job_a = alice.submit(
        {"kind": "job", "name": "hb-job", "team": "hard-a", "command": "true"}, None
    )
    data = b"made by a job"
    for job_id in (job_b["id"], "no-such-job"):
        resp = begin(alice, "hb-made", one_file(data), producer_job=job_id)
        refused(resp, 400, "producer_job", repr(job_id), "'hard-a' has no such job")
    assert "hb-made" not in names(alice)
    v = arts.push(
        alice, make_tree(tmp_path / "s", {"f": data}), "hb-made", "model", producer_job=job_a["id"]
    )
    assert v["producer_job"] == job_a["id"]


# --- 6. numbers past 2^63 ---------------------------------------------------------------------


def test_huge_version_numbers_answer_400_naming_the_version(alice, tmp_path):
    arts.push(alice, make_tree(tmp_path / "s", {"f": b"v"}), "hb-ver", "model")
    big = "99999999999999999999"
    base = "/v1/artifacts/hard-a/hb-ver"
    for method, url, body in [
        ("GET", f"{base}/versions/{big}", None),
        ("GET", f"{base}/versions/{big}/blobs/{'0' * 64}", None),
        ("DELETE", f"{base}/versions/{big}", None),
        ("PUT", f"{base}/tags/good", {"version": big}),
        ("POST", UPLOADS, {"name": f"hb-ver:{big}", "files": []}),
    ]:
        resp = alice.send(method, url, json=body)
        refused(resp, 400, f"version '{big}'")
    resp = alice.send("GET", f"{base}/versions/%C2%B2")  # '²': str.isdigit() but no number
    assert resp.status_code in (400, 404)
    assert [v["version"] for v in arts.describe(alice, "hb-ver")["versions"]] == [1]


# --- OpenAPI ----------------------------------------------------------------------------------


def test_every_artifact_route_declares_its_error_statuses(admin):
    doc = admin.request_json("GET", "/openapi.json")
    assert "ErrorBody" in doc["components"]["schemas"]
    ops = [
        (path, method, op)
        for path, item in doc["paths"].items()
        if path.startswith("/v1/artifacts")
        for method, op in item.items()
    ]
    assert len(ops) >= 15
    for path, method, op in ops:
        errors = {int(c) for c in op["responses"] if int(c) >= 400}
        assert 401 in errors and len(errors) >= 2, (path, method, errors)
        assert 500 not in errors
        for code in errors:
            ref = op["responses"][str(code)]["content"]["application/json"]["schema"]["$ref"]
            assert ref.endswith("/ErrorBody"), (path, method, code)
    commit = doc["paths"]["/v1/artifacts/uploads/{upload_id}/commit"]["post"]["responses"]
    assert {"400", "404", "409"} <= set(commit)
