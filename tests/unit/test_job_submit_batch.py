"""Submitting many jobs in one request (POST /v1/jobs/batch, Client.submit_batch,
`aicluster submit A.yaml B.yaml`): all stored in one transaction, or none; an error names
`specs[i].FIELD`; the queue cap counts the whole batch. Real API server on 127.0.0.1, real
store (SQLite and PostgreSQL)."""

from __future__ import annotations

import httpx
import pytest
from typer.testing import CliRunner

from aicluster.api.app import create_app
from aicluster.api.bodies import MAX_BATCH_JOBS
from aicluster.cli.main import app as cli
from aicluster.client.api import ApiError, Client
from aicluster.control.api_ops import ApiOps
from aicluster.control.budgets import BudgetOps
from aicluster.control.usage import Accountant
from aicluster.specs.job import JobSpec
from aicluster.store import open_store
from aicluster.store.budgets import BudgetStore
from aicluster.store.errors import NotFound
from aicluster.store.identity import Principal
from aicluster.store.usage import UsageStore

from asgi_server import serving
from fakes import FakeClock

ADMIN = Principal("admin", None, "admin")


def _spec(name: str, team: str = "ml", **more) -> dict:
    return {"kind": "job", "name": name, "team": team, "command": "true", **more}


@pytest.fixture
def world(state_url, tmp_path):
    store = open_store(state_url, clock=FakeClock())
    for team in ("ml", "cv"):
        store.create_team(team)
    store.create_user("admin", None, "admin")
    store.create_user("mia", "ml", "member")
    store.create_user("vic", "ml", "viewer")
    tokens = {u: store.create_token(u) for u in ("admin", "mia", "vic")}
    usage = UsageStore(store)
    accountant = Accountant(usage, nodes=list, clock=store.clock)
    budgets = BudgetOps(store, BudgetStore(store), usage, accountant)
    api = ApiOps(store, engine=None, logs=None, workdirs=tmp_path / "wd", budgets=budgets)
    with serving(create_app(api)) as url:
        yield store, url, tokens, budgets
    store.close()


def _post(url: str, token: str, body) -> httpx.Response:
    auth = {"Authorization": f"Bearer {token}"}
    return httpx.post(url + "/v1/jobs/batch", json=body, headers=auth, timeout=30)


def test_a_batch_is_stored_in_order_each_job_pending_with_its_event(world):
    store, url, tokens, _ = world
    with Client(url, tokens["mia"]) as c:
        jobs = c.submit_batch([_spec(f"b{i}", resources={"cpus": i + 1}) for i in range(3)])
    assert [j["name"] for j in jobs] == ["b0", "b1", "b2"]
    assert {j["status"] for j in jobs} == {"PENDING"} and {j["owner"] for j in jobs} == {"mia"}
    for i, j in enumerate(jobs):
        rec = store.get_job(j["id"])
        assert rec.spec.resources.cpus == i + 1
        assert [e.type for e in store.list_events(object_id=j["id"])] == ["JobSubmitted"]


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (_spec("x", resources={"gpus": -1}), "specs[2].resources.gpus"),
        (_spec("x", team="cv"), "specs[2].team"),  # a member submits to its own team only
        (_spec("x", team="nope"), "specs[2].team"),
        ({"kind": "service", "name": "s", "team": "ml", "model": "m"}, "specs[2].kind"),
        (_spec("x", bogus=1), "specs[2].bogus"),
    ],
)
def test_one_bad_spec_refuses_the_whole_batch_naming_it(world, bad, field):
    store, url, tokens, _ = world
    r = _post(url, tokens["mia"], {"specs": [_spec("ok0"), _spec("ok1"), bad]})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail["field"] == field and detail["message"].startswith("invalid spec specs[2]")
    assert store.list_jobs(limit=None) == []  # nothing stored


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"specs": []}, 422, "specs"),
        ({"specs": [_spec("a")] * (MAX_BATCH_JOBS + 1)}, 422, "specs"),
        ({"specs": "not a list"}, 422, "specs"),
        ({"specs": [_spec("a")], "extra": 1}, 422, "extra"),
    ],
)
def test_malformed_batches_get_a_4xx_naming_the_field(world, body, status, field):
    store, url, tokens, _ = world
    r = _post(url, tokens["mia"], body)
    assert r.status_code == status, r.text
    assert field in r.json()["detail"]["field"]
    assert store.list_jobs(limit=None) == []


def test_viewers_and_strangers_cannot_submit_a_batch(world):
    store, url, tokens, _ = world
    assert _post(url, tokens["vic"], {"specs": [_spec("a")]}).status_code == 403
    assert _post(url, "not-a-token", {"specs": [_spec("a")]}).status_code == 401
    assert store.list_jobs(limit=None) == []


def test_the_queue_cap_counts_the_whole_batch(world):
    store, url, tokens, budgets = world
    budgets.put(ADMIN, "ml", {"monthly_usd": 100.0, "max_queued_jobs": 3})
    with Client(url, tokens["mia"]) as c:
        c.submit_batch([_spec("a"), _spec("b")])
        with pytest.raises(ApiError) as exc:
            c.submit_batch([_spec("c"), _spec("d")])  # 2 + 2 > 3: neither
    assert exc.value.status_code == 429
    assert "max_queued_jobs cap of 3 and 2 more would pass it" in str(exc.value)
    assert len(store.list_jobs(limit=None)) == 2
    with Client(url, tokens["mia"]) as c:
        assert len(c.submit_batch([_spec("c")])) == 1  # room for exactly one


def test_the_store_writes_a_batch_all_or_none(world):
    store, _url, _tokens, _ = world
    specs = [
        JobSpec(name="a", team="ml", command="true"),
        JobSpec(name="b", team="gone", command="true"),
    ]
    with pytest.raises(NotFound):
        store.create_jobs(specs, "admin")
    assert store.list_jobs(limit=None) == []


def test_the_cli_submits_several_files_as_one_batch(world, tmp_path):
    store, url, tokens, _ = world
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('hi')\n")
    (tmp_path / "other").mkdir()
    for name, wd in (("one", "code"), ("two", "code"), ("three", None), ("odd", "other")):
        extra = f"working_dir: {wd}\n" if wd else ""
        (tmp_path / f"{name}.yaml").write_text(
            f"kind: job\nname: {name}\nteam: ml\ncommand: python train.py\n{extra}"
        )
    base = ["--url", url, "--token", tokens["mia"]]
    files = [str(tmp_path / f"{n}.yaml") for n in ("one", "two", "three")]
    run = CliRunner().invoke(cli, ["submit", *files, *base])
    assert run.exit_code == 0, run.output
    said = [line.split()[1] for line in run.output.splitlines() if line.startswith("submitted")]
    jobs = [store.get_job(j) for j in said]
    assert [j.name for j in jobs] == ["one", "two", "three"]
    assert jobs[0].workdir and jobs[0].workdir == jobs[1].workdir  # packed once, shared
    # two working directories cannot share one batch; -f follows one job only
    odd = CliRunner().invoke(cli, ["submit", files[0], str(tmp_path / "odd.yaml"), *base])
    assert odd.exit_code == 2 and "working_dir" in odd.output, odd.output
    follow = CliRunner().invoke(cli, ["submit", *files[:2], "-f", *base])
    assert follow.exit_code == 2 and "--follow" in follow.output, follow.output
    assert len(store.list_jobs(limit=None)) == 3
