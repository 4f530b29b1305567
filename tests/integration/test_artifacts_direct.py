"""The direct data path over a real artifact API (uvicorn on loopback) on a local folder
and on an S3-protocol server (moto): round trips that carry no blob bytes through the
API, grants that one team cannot use for another's blobs, corruption found on read and
by the scrub, an interrupted direct upload that resumes, the fallback to the API's
byte routes when a grant cannot be used on this machine, chunked files whose next
version sends (and a node with the previous one fetches) only the changed chunks, and
retention that deletes exactly what the policy drops while a kept version is pulled.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import boto3
import pytest
from fastapi import Depends, FastAPI, HTTPException
from fastapi.security import HTTPBearer

from aicluster.api.app import job_token_may
from aicluster.api.artifacts_routes import artifact_router
from aicluster.api.errors import install_error_handlers
from aicluster.artifacts.chunks import CHUNK_SIZE, CHUNKED_ABOVE
from aicluster.client import artifacts as arts
from aicluster.client import transfer
from aicluster.client.api import ApiError, Client
from aicluster.control.api_ops import BadRequest, ForbiddenError, NotFoundError
from aicluster.control.artifacts import ArtifactService
from aicluster.runtime.cache import BlobCache
from aicluster.store import open_store
from aicluster.store.artifacts import ArtifactStore
from aicluster.store.errors import Conflict, NotFound

from artifact_support import home, make_tree, read_tree, s3_server, storage
from asgi_server import serving


class Requests:
    """ASGI middleware: the (method, path) of every request the API served."""

    def __init__(self, app):
        self.app, self.seen = app, []

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            self.seen.append((scope["method"], scope["path"]))
        await self.app(scope, receive, send)

    def byte_routes(self) -> list:
        return [r for r in self.seen if "/blobs/" in r[1]]


@pytest.fixture
def api(home, storage):
    """(url, tokens {alice, bob, admin}, ArtifactStore, Requests) of a fresh artifact API."""
    store = open_store(home / "state.db")
    for team in ("da", "db"):
        store.ensure_team(team)
    tokens = {}
    for user, team, role in (("alice", "da", "member"), ("bob", "db", "member")):
        store.create_user(user, team, role)
        tokens[user] = store.create_token(user)
    store.create_user("root", None, "admin")
    tokens["admin"] = store.create_token("root")
    bearer = HTTPBearer()

    def principal(creds=Depends(bearer)):
        who = store.authenticate(creds.credentials)
        if who is None:
            raise HTTPException(401)
        return who

    artifacts = ArtifactStore.open(store, home, storage)
    app = FastAPI()
    install_error_handlers(
        app,
        {NotFoundError: 404, NotFound: 404, ForbiddenError: 403, BadRequest: 400, Conflict: 409},
    )

    @app.get("/v1/whoami")
    def whoami(who=Depends(principal)):
        return {"user": who.user, "team": who.team, "role": who.role}

    app.include_router(artifact_router(ArtifactService(artifacts), principal))
    seen = Requests(app)
    with serving(seen) as url:
        yield url, tokens, artifacts, seen
    store.close()


def client(api, who: str) -> Client:
    return Client(api[0], api[1][who], timeout=60)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def corrupt(artifacts: ArtifactStore, storage, digest: str) -> None:
    """Overwrite a stored blob in place with bytes of the same size."""
    backend = artifacts.backend
    size = backend.size(digest)
    if backend.local:
        path = Path(backend.blob_path(digest))
        os.chmod(path, 0o644)
        path.write_bytes(b"\0" * size)
        return
    bucket, _, key = backend.blob_path(digest).partition("/")
    s3 = boto3.client(
        "s3",
        endpoint_url=storage.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing-secret",
    )
    s3.put_object(Bucket=bucket, Key=key, Body=b"\0" * size)


def test_round_trip_carries_no_blob_bytes_through_the_api(api, tmp_path):
    files = {
        "weights/a.bin": os.urandom(3 << 20),
        "weights/b.bin": os.urandom(5000),
        "same-as-b.bin": b"",
        "empty": b"",
        "config.json": b'{"layers": 2}',
    }
    files["same-as-b.bin"] = files["weights/b.bin"]
    src = make_tree(tmp_path / "model", files)
    with client(api, "alice") as c:
        plan = []
        v = arts.push(c, src, "llm", "model", on_plan=lambda n, b: plan.append((n, b)))
        assert v["ref"] == "da/llm:1" and plan == [(4, (3 << 20) + 5000 + 13)]
        _, out = arts.pull(c, "llm", tmp_path / "out")
        assert read_tree(out) == files
        cache = BlobCache(tmp_path / "cache", 1 << 30)
        _, r1 = arts.pull(c, "llm", tmp_path / "r1", cache=cache)
        _, r2 = arts.pull(c, "llm", tmp_path / "r2", cache=cache)
        assert read_tree(r1) == read_tree(r2) == files
        again = arts.push(c, src, "llm", "model", on_plan=lambda n, b: plan.append((n, b)))
        assert again["version"] == 2 and plan[-1] == (0, 0)
    assert api[3].byte_routes() == []
    assert ("POST", "/v1/artifacts/uploads/" + "x") not in api[3].seen
    assert any(p.endswith("/publish") for _, p in api[3].seen)


def test_a_grant_for_one_teams_blob_cannot_serve_another(api, tmp_path):
    secret = os.urandom(70_000)
    files = [{"path": "w", "size": len(secret), "sha256": sha(secret)}]
    with client(api, "alice") as alice, client(api, "bob") as bob:
        up_a = alice.request_json(
            "POST", "/v1/artifacts/uploads", json={"name": "w", "files": files, "direct": True}
        )
        src = make_tree(tmp_path / "s", {"w": secret}) / "w"
        place = (src, 0, len(secret))
        transfer.stage(up_a["grant"], {sha(secret): place})  # staged, not yet published
        up_b = bob.request_json(
            "POST", "/v1/artifacts/uploads", json={"name": "w", "files": files, "direct": True}
        )
        assert up_b["missing"] == [sha(secret)]
        res = bob.request_json(
            "POST",
            f"/v1/artifacts/uploads/{up_b['upload_id']}/publish",
            json={"digests": [sha(secret)]},
        )
        assert res["published"] == [] and "not staged" in res["refused"][sha(secret)]
        for method, path, body in (
            ("POST", f"/v1/artifacts/uploads/{up_a['upload_id']}/grant", {"digests": []}),
            ("POST", f"/v1/artifacts/uploads/{up_a['upload_id']}/publish", {"digests": []}),
        ):
            with pytest.raises(ApiError) as exc:
                bob.request_json(method, path, json=body)
            assert exc.value.status_code == 404
        with pytest.raises(ApiError) as exc:
            bob.request_json("POST", f"/v1/artifacts/uploads/{up_b['upload_id']}/commit")
        assert exc.value.status_code == 409
        alice.request_json(
            "POST",
            f"/v1/artifacts/uploads/{up_a['upload_id']}/publish",
            json={"digests": [sha(secret)]},
        )
        alice.request_json("POST", f"/v1/artifacts/uploads/{up_a['upload_id']}/commit")
        with pytest.raises(ApiError) as exc:  # bob cannot even ask where alice's blob is
            bob.request_json("POST", "/v1/artifacts/da/w/versions/1/grant", json={})
        assert exc.value.status_code == 404
        grant = alice.request_json(
            "POST", "/v1/artifacts/da/w/versions/1/grant", json={"digests": [sha(secret)]}
        )["grant"]
        names = grant["paths"] if grant["kind"] == "file" else grant["get"]
        assert list(names) == [sha(secret)] and sha(secret) in names[sha(secret)]
        with pytest.raises(ApiError) as exc:  # a digest outside the version: no grant
            alice.request_json(
                "POST", "/v1/artifacts/da/w/versions/1/grant", json={"digests": ["0" * 64]}
            )
        assert exc.value.status_code == 404


def test_corruption_is_found_on_read_and_by_the_scrub(api, storage, tmp_path):
    data = os.urandom(200_000)
    with client(api, "alice") as c, client(api, "admin") as admin:
        arts.push(c, make_tree(tmp_path / "s", {"w": data}), "c", "model")
        corrupt(api[2], storage, sha(data))
        with pytest.raises(ApiError) as exc:
            arts.pull(c, "c", tmp_path / "out")
        assert exc.value.status_code == 502 and "do not match" in exc.value.message
        assert not (tmp_path / "out").exists()
        with pytest.raises(ApiError) as exc:
            arts.pull(c, "c", tmp_path / "r", cache=BlobCache(tmp_path / "cache", 1 << 30))
        assert exc.value.status_code == 502 and "do not match" in exc.value.message
        with pytest.raises(ApiError) as exc:
            c.request_json("POST", "/v1/artifacts/scrub", json={})
        assert exc.value.status_code == 403
        report = admin.request_json("POST", "/v1/artifacts/scrub", json={})
        assert report["corrupt"] == [sha(data)] and report["deleted"] is False
        report = admin.request_json("POST", "/v1/artifacts/scrub", json={"repair": True})
        assert report["deleted"] is True
        assert admin.request_json("POST", "/v1/artifacts/scrub", json={})["corrupt"] == []
        plan = []  # the repaired blob is stored again by the next push of its bytes
        arts.push(c, tmp_path / "s", "c", "model", on_plan=lambda n, b: plan.append((n, b)))
        assert plan == [(1, len(data))]
        assert read_tree(arts.pull(c, "c:2", tmp_path / "again")[1]) == {"w": data}


def test_an_interrupted_direct_upload_resumes_and_shows_nothing(api, tmp_path):
    files = {f"part-{i}": os.urandom(50_000) for i in range(4)}
    src = make_tree(tmp_path / "d", files)
    entries = [{"path": k, "size": len(v), "sha256": sha(v)} for k, v in files.items()]
    with client(api, "alice") as c:
        up = c.request_json(
            "POST", "/v1/artifacts/uploads", json={"name": "d", "files": entries, "direct": True}
        )
        first = sorted(files)[:2]
        transfer.stage(up["grant"], {sha(files[k]): (src / k, 0, 50_000) for k in first})
        c.request_json(
            "POST",
            f"/v1/artifacts/uploads/{up['upload_id']}/publish",
            json={"digests": [sha(files[k]) for k in first]},
        )  # ... and the pusher dies here
        assert arts.list_artifacts(c) == []
        plan = []
        v = arts.push(c, src, "d", "dataset", on_plan=lambda n, b: plan.append((n, b)))
        assert plan == [(2, 100_000)] and v["version"] == 1
        assert read_tree(arts.pull(c, "d", tmp_path / "out")[1]) == files


def test_a_grant_this_machine_cannot_use_falls_back_to_the_api(api, tmp_path):
    data = os.urandom(10_000)
    src = make_tree(tmp_path / "s", {"w": data})
    with client(api, "alice") as c:
        up = c.request_json(
            "POST",
            "/v1/artifacts/uploads",
            json={"name": "fb", "files": [{"path": "w", "size": len(data), "sha256": sha(data)}]},
        )
        unusable = {"kind": "file", "staging": str(tmp_path / "not-mounted-here")}
        with pytest.raises(transfer.GrantUnusable):
            transfer.stage(unusable, {sha(data): (src / "w", 0, len(data))})
        where = {sha(data): (src / "w", 0, len(data))}
        assert arts._send(c, up["upload_id"], [sha(data)], where, unusable, None) is None
        c.request_json("POST", f"/v1/artifacts/uploads/{up['upload_id']}/commit")
        assert ("PUT", f"/v1/artifacts/uploads/{up['upload_id']}/blobs/{sha(data)}") in api[3].seen
        v = arts.version(c, "fb")
        fetch = transfer.fetcher(
            {"kind": "file", "paths": {sha(data): str(tmp_path / "nope")}},
            arts.blob_fetcher(c, v),
        )
        assert b"".join(fetch(sha(data))) == data


def test_a_jobs_token_may_ask_for_read_grants_only():
    assert job_token_may("POST", "/v1/artifacts/t/n/versions/3/grant")
    assert job_token_may("POST", "/v1/artifacts/uploads/abc/grant")  # its own uploads
    assert not job_token_may("POST", "/v1/artifacts/scrub")
    assert not job_token_may("POST", "/v1/artifacts/gc")
    assert not job_token_may("POST", "/v1/artifacts/t/n/grant")


def test_a_new_version_of_a_chunked_file_sends_only_the_changed_chunks(api, tmp_path):
    size = CHUNKED_ABOVE + CHUNK_SIZE // 2  # three chunks, the last one half
    data = bytearray(os.urandom(size))
    src = make_tree(tmp_path / "ck", {"model.bin": bytes(data), "small": b"s"})
    with client(api, "alice") as c:
        plan = []
        v1 = arts.push(c, src, "ck", "checkpoint", on_plan=lambda n, b: plan.append((n, b)))
        files = {f["path"]: f for f in arts.version(c, "ck:1")["files"]}
        assert len(files["model.bin"]["chunks"]) == 3 and "chunks" not in files["small"]
        assert plan == [(4, size + 1)] and v1["size"] == size + 1
        cache = BlobCache(tmp_path / "cache", 1 << 30)
        _, r1 = arts.pull(c, "ck:1", tmp_path / "r1", cache=cache)
        data[CHUNK_SIZE + 100 : CHUNK_SIZE + 200] = os.urandom(100)  # inside chunk 2
        (src / "model.bin").write_bytes(bytes(data))
        arts.push(c, src, "ck", "checkpoint", on_plan=lambda n, b: plan.append((n, b)))
        assert plan[-1] == (1, CHUNK_SIZE)
        _, r2 = arts.pull(
            c, "ck:2", tmp_path / "r2", cache=cache, on_plan=lambda n, b: plan.append((n, b))
        )
        assert plan[-1] == (1, CHUNK_SIZE)  # the node had v1: only the new chunk comes
        _, plain = arts.pull(c, "ck:2", tmp_path / "plain")
        assert read_tree(r2) == read_tree(plain) == {"model.bin": bytes(data), "small": b"s"}
        assert read_tree(r1)["model.bin"] != bytes(data)


def test_chunk_lists_are_checked_and_a_corrupt_chunk_is_found(api, storage, tmp_path):
    size = CHUNKED_ABOVE + 10
    data = os.urandom(size)
    src = make_tree(tmp_path / "s", {"big": data})
    entry = transfer.scan(src)[0][0]
    with client(api, "alice") as c:
        bad = [
            dict(entry.as_dict(), sha256="0" * 64),
            dict(entry.as_dict(), chunks=list(entry.chunks[:1])),
            dict(entry.as_dict(), size=CHUNKED_ABOVE, chunks=list(entry.chunks)),
        ]
        for f, says in zip(bad, ("chunk root", "chunks, but", "only files over")):
            with pytest.raises(ApiError) as exc:
                c.request_json("POST", "/v1/artifacts/uploads", json={"name": "b", "files": [f]})
            assert exc.value.status_code == 400 and says in exc.value.message
            assert "big" in exc.value.message
        arts.push(c, src, "big", "model")
        corrupt(api[2], storage, entry.chunks[1])
        with pytest.raises(ApiError) as exc:
            arts.pull(c, "big", tmp_path / "out")
        assert exc.value.status_code == 502 and not (tmp_path / "out").exists()
        with pytest.raises(ApiError, match="do not match"):
            arts.pull(c, "big", tmp_path / "r", cache=BlobCache(tmp_path / "cache", 1 << 30))


def test_retention_keeps_what_the_policy_says_while_a_kept_version_is_pulled(api, tmp_path):
    common = os.urandom(1 << 20)
    unique = {v: os.urandom(300_000) for v in range(1, 13)}
    with client(api, "alice") as c:
        for v in range(1, 13):
            src = make_tree(tmp_path / f"v{v}", {"common": common, "step": unique[v]})
            arts.push(c, src, "train-ckpt", "checkpoint")
        arts.tag(c, "train-ckpt:2", "best")
        before = len(api[2].backend.list_blobs())
        pulled: list = []
        puller = threading.Thread(
            target=lambda: pulled.append(arts.pull(c, "train-ckpt:5", tmp_path / "p5")[1])
        )
        puller.start()
        res = arts.prune(c, "train-ckpt", keep_last=3, keep_every=5)
        puller.join(timeout=120)
        assert res["deleted"] == [1, 3, 4, 6, 7, 8, 9]
        gone = 2 * 7  # each deleted version's own blob and its manifest
        assert res["gc"]["deleted"] == gone and before - len(api[2].backend.list_blobs()) == gone
        assert read_tree(pulled[0]) == {"common": common, "step": unique[5]}
        kept = [v["version"] for v in arts.describe(c, "train-ckpt")["versions"]]
        assert kept == [2, 5, 10, 11, 12]
        for v in kept:
            got = read_tree(arts.pull(c, f"train-ckpt:{v}", tmp_path / f"k{v}")[1])
            assert got == {"common": common, "step": unique[v]}
        with pytest.raises(ApiError) as exc:
            arts.prune(c, "train-ckpt", keep_last=0)
        assert exc.value.status_code == 422 and "keep_last" in exc.value.message
    with client(api, "bob") as bob, pytest.raises(ApiError) as exc:
        arts.prune(bob, "da/train-ckpt", keep_last=1)
    assert exc.value.status_code == 404


def test_checkpoint_save_applies_the_job_specs_policy(api, tmp_path):
    from aicluster.runtime import checkpoint
    from aicluster.specs.job import CheckpointPolicy

    env = {
        "AICLUSTER_URL": api[0],
        "AICLUSTER_TOKEN": api[1]["alice"],
        "AICLUSTER_TEAM": "da",
        "AICLUSTER_JOB_NAME": "fit",
        **CheckpointPolicy(keep_last=2, keep_every=3).env(),
    }
    for step in range(1, 8):
        src = make_tree(tmp_path / f"s{step}", {"w": os.urandom(1000)})
        assert checkpoint.save(src, step=step, env=env) == f"da/fit-ckpt:{step}"
    with client(api, "alice") as c:
        kept = [v["version"] for v in arts.describe(c, "fit-ckpt")["versions"]]
    assert kept == [3, 6, 7]


def test_cli_prune_and_scrub(api, tmp_path):
    from typer.testing import CliRunner

    from aicluster.cli.main import app

    def cli(who: str, *args: str):
        res = CliRunner().invoke(app, ["artifacts", *args, "--url", api[0], "--token", api[1][who]])
        return res.exit_code, res.stdout, res.stderr

    with client(api, "alice") as c:
        for v in range(3):
            arts.push(c, make_tree(tmp_path / f"s{v}", {"f": os.urandom(100)}), "cp", "checkpoint")
    code, out, err = cli("alice", "prune", "cp", "--keep-last", "1")
    assert code == 0 and "deleted versions: 1, 2" in out, err
    code, _, err = cli("alice", "prune", "cp", "--keep-last", "0")
    assert code == 2 and "keep_last" in err and "Traceback" not in err  # 422: exit 2
    code, out, _ = cli("alice", "usage")
    assert code == 0 and out.startswith("da: ") and "1 version(s)" in out
    code, out, _ = cli("admin", "scrub")
    assert code == 0 and "checked" in out
    code, _, err = cli("alice", "scrub")
    assert code == 1 and "admin" in err


def test_storage_usage_per_team(api, tmp_path):
    shared, mine = os.urandom(40_000), os.urandom(10_000)
    with client(api, "alice") as alice, client(api, "bob") as bob:
        with client(api, "admin") as admin:
            arts.push(alice, make_tree(tmp_path / "a", {"s": shared, "m": mine}), "u1", "model")
            arts.push(alice, make_tree(tmp_path / "b", {"s": shared}), "u2", "model")
            arts.push(bob, make_tree(tmp_path / "c", {"s": shared}), "u3", "model")
            everyone = arts.usage(admin)
        da = arts.usage(alice)
        assert list(da) == ["da"] and da["da"]["versions"] == 2
        manifests = da["da"]["bytes"] - len(shared) - len(mine)
        assert da["da"]["blobs"] == 2 + 2 and 0 < manifests < 4000  # shared counted once
        assert everyone["da"] == da["da"] and everyone["db"]["blobs"] == 2
        assert arts.usage(bob, team="da") == {}
