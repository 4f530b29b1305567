"""Per-team storage quotas through the real API app (api.app.create_app: its auth, error
handlers and audit) served by uvicorn on loopback, with the SDK and the CLI: admins set,
read and clear a team's quota, members read their own team's only; an upload past it is
refused with a 413 naming the quota, the team and the figures, nothing stored; deleting
versions frees room; bad input is a 4xx naming the field, and a CLI error, never a
traceback. No Ray: the control plane here has no engine.
"""

from __future__ import annotations

import os

import httpx
import pytest
from typer.testing import CliRunner

from aicluster.api.app import create_app
from aicluster.api.artifacts_routes import artifact_router
from aicluster.api.storage_quota_routes import storage_quota_router
from aicluster.cli.main import app as cli_app
from aicluster.client import artifacts as arts
from aicluster.client.api import ApiError, Client
from aicluster.control.api_ops import ApiOps
from aicluster.control.artifacts import ArtifactService
from aicluster.control.storage_quota import StorageQuotaOps
from aicluster.runtime import checkpoint
from aicluster.store import open_store
from aicluster.store.artifacts import ArtifactStore, StorageConfig

from artifact_support import make_tree
from asgi_server import serving

KB = 1000


@pytest.fixture
def api(tmp_path):
    """(url, tokens {alice: qa member, bob: qb member, admin}, ArtifactStore)."""
    store = open_store(tmp_path / "state.db")
    for team in ("qa", "qb"):
        store.ensure_team(team)
    tokens = {}
    for user, team, role in (("alice", "qa", "member"), ("bob", "qb", "member")):
        store.create_user(user, team, role)
        tokens[user] = store.create_token(user)
    store.create_user("root", None, "admin")
    tokens["admin"] = store.create_token("root")
    repo = ArtifactStore.open(store, tmp_path / "home", StorageConfig(url=str(tmp_path / "blobs")))
    svc = ArtifactService(repo)
    app = create_app(
        ApiOps(store, engine=None, logs=None, workdirs=tmp_path, artifacts=svc),
        routers=[
            lambda p: artifact_router(svc, p),
            lambda p: storage_quota_router(StorageQuotaOps(repo, store.team_exists), p),
        ],
    )
    with serving(app) as url:
        yield url, tokens, repo
    store.close()


def call(api, who: str, method: str, path: str, **kw) -> httpx.Response:
    return httpx.request(
        method, api[0] + path, headers={"Authorization": f"Bearer {api[1][who]}"}, **kw
    )


def cli(api, who: str, *args: str):
    res = CliRunner().invoke(cli_app, ["artifacts", *args, "--url", api[0], "--token", api[1][who]])
    return res.exit_code, res.stdout, res.stderr


def client(api, who: str) -> Client:
    return Client(api[0], api[1][who], timeout=60)


QA = "/v1/teams/qa/storage-quota"


def test_admins_set_and_clear_members_read_their_own(api):
    r = call(api, "alice", "PUT", QA, json={"bytes": 10})
    assert r.status_code == 403 and "only admins" in r.json()["detail"]["message"]
    r = call(api, "admin", "PUT", QA, json={"bytes": 50 * KB})
    assert r.status_code == 200, r.text
    assert r.json() | {"updated_at": None} == {
        "team": "qa",
        "quota_bytes": 50 * KB,
        "used_bytes": 0,
        "blobs": 0,
        "versions": 0,
        "updated_at": None,
        "updated_by": "root",
    }
    assert call(api, "alice", "GET", QA).json()["quota_bytes"] == 50 * KB
    for who, path in (("alice", "/v1/teams/qb/storage-quota"), ("bob", QA)):
        r = call(api, who, "GET", path)
        assert r.status_code == 403 and "your own team" in r.json()["detail"]["message"]
    r = call(api, "alice", "GET", "/v1/teams/nope/storage-quota")
    assert r.status_code == 403  # another team's, existing or not: the same answer
    with client(api, "alice") as c:
        assert arts.usage(c) == {
            "qa": {"bytes": 0, "blobs": 0, "versions": 0, "quota_bytes": 50 * KB}
        }
    with client(api, "admin") as c:
        assert set(arts.usage(c)) == {"qa"} and arts.usage(c, "qb") == {}
    r = call(api, "admin", "DELETE", QA)
    assert r.status_code == 200 and r.json()["removed"] and r.json()["quota_bytes"] is None
    assert call(api, "admin", "DELETE", QA).json()["removed"] is False


@pytest.mark.parametrize(
    "method, path, body, status, field",
    [
        ("PUT", QA, {"bytes": -1}, 422, "bytes"),
        ("PUT", QA, {"bytes": "10G"}, 422, "bytes"),
        ("PUT", QA, {"bytes": 1.5}, 422, "bytes"),
        ("PUT", QA, {"bytes": 2**64}, 422, "bytes"),
        ("PUT", QA, {}, 422, "bytes"),
        ("PUT", QA, {"bytes": 1, "soft": True}, 422, "soft"),
        ("PUT", "/v1/teams/Bad_Team/storage-quota", {"bytes": 1}, 422, "team"),
        ("PUT", "/v1/teams/nope/storage-quota", {"bytes": 1}, 404, "nope"),
        ("DELETE", "/v1/teams/nope/storage-quota", None, 404, "nope"),
        ("GET", "/v1/teams/nope/storage-quota", None, 404, "nope"),
    ],
)
def test_bad_input_is_a_4xx_naming_the_field(api, method, path, body, status, field):
    r = call(api, "admin", method, path, json=body)
    assert r.status_code == status, r.text
    assert field in r.text


def test_an_upload_past_the_quota_is_refused_and_deleting_frees_room(api, tmp_path):
    call(api, "admin", "PUT", QA, json={"bytes": 30 * KB}).raise_for_status()
    small = make_tree(tmp_path / "small", {"w": os.urandom(10 * KB)})
    big = make_tree(tmp_path / "big", {"w": os.urandom(25 * KB)})
    with client(api, "alice") as alice:
        arts.push(alice, small, "m")  # under the quota: stored
        blobs = set(api[2].backend.list_blobs())
        used = arts.usage(alice)["qa"]["bytes"]
        with pytest.raises(ApiError) as exc:
            arts.push(alice, big, "m")
        e = exc.value
        assert e.status_code == 413 and "storage quota of team 'qa' exceeded" in e.message
        assert {k: e.detail[k] for k in ("field", "team", "quota_bytes", "used_bytes")} == {
            "field": "quota",
            "team": "qa",
            "quota_bytes": 30 * KB,
            "used_bytes": used,
        }
        assert 25 * KB < e.detail["requested_bytes"] < 27 * KB
        # nothing of it stored: no blob, no upload session, no version
        assert set(api[2].backend.list_blobs()) == blobs and api[2].index.upload_ids() == set()
        assert [v["version"] for v in arts.describe(alice, "m")["versions"]] == [1]
        code, _, err = cli(api, "alice", "push", str(big), "m")
        assert code == 1 and "storage quota of team 'qa'" in err and "Traceback" not in err
        env = {"AICLUSTER_URL": api[0], "AICLUSTER_TOKEN": api[1]["alice"]}
        env |= {"AICLUSTER_TEAM": "qa", "AICLUSTER_JOB_NAME": "train"}
        with pytest.raises(ApiError) as exc:  # a job's checkpoint: the same refusal
            checkpoint.save(big, step=1, env=env)
        assert exc.value.status_code == 413 and "quota" in exc.value.message
        assert api[2].index.get("qa", "train-ckpt") is None
        # another team keeps its own room: qb has no quota
        with client(api, "bob") as bob:
            arts.push(bob, big, "m")
        arts.delete(alice, "m:1")  # collects what no version names
        assert arts.usage(alice)["qa"]["bytes"] == 0
        assert arts.push(alice, big, "m")["version"] == 2


def test_the_cli_sets_shows_and_clears_sizes(api):
    code, out, err = cli(api, "admin", "quota", "set", "qa", "10Gi")
    assert code == 0 and out.strip() == "qa: 0 B of 10 GiB quota (0.0%)", err
    assert call(api, "alice", "GET", QA).json()["quota_bytes"] == 10 * 2**30
    code, out, _ = cli(api, "alice", "quota", "show")
    assert code == 0 and out.strip() == "qa: 0 B of 10 GiB quota (0.0%)"
    code, out, _ = cli(api, "alice", "usage")
    assert code == 0 and out.strip().endswith("quota 10 GiB")
    for args, says in (
        (("quota", "set", "qa", "lots"), "SIZE"),
        (("quota", "set", "qa", "-5"), "SIZE"),
    ):
        code, _, err = cli(api, "admin", *args)
        assert code == 2 and says in err and "Traceback" not in err, err
    code, _, err = cli(api, "alice", "quota", "set", "qa", "1G")
    assert code == 1 and "only admins" in err and "Traceback" not in err
    code, _, err = cli(api, "alice", "quota", "show", "qb")
    assert code == 1 and "your own team" in err
    code, out, _ = cli(api, "admin", "quota", "clear", "qa")
    assert code == 0 and out.strip() == "qa: 0 B (no quota)"
