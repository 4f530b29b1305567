"""Pages of the list routes through the real control plane on loopback (api.paging): each
page holds at most `limit` rows, following `next_cursor` reads every row once in the
list's order and ends with null; a bad `limit` is a 422 and a cursor the list did not hand
out a 400, each naming its field; the client and the CLI's --limit and --all-pages page
the same way."""

from __future__ import annotations

import json

import httpx
import pytest
from typer.testing import CliRunner

from aicluster.cli.main import app

pytestmark = pytest.mark.ray
TEAM = "paging-a"
N_JOBS = 7


@pytest.fixture(scope="module")
def jobs(admin):
    """N_JOBS jobs of TEAM, newest first; cancelled (their rows stay)."""
    if TEAM not in admin.teams():
        admin.create_team(TEAM)
    made = []
    for i in range(N_JOBS):
        spec = {"kind": "job", "name": f"page-{i}", "team": TEAM, "command": "true"}
        spec["resources"] = {"gpus": 64}  # never fits the test cluster: it stays PENDING
        made.append(admin.submit(spec)["id"])
    for job_id in made:
        admin.cancel(job_id)
    return made[::-1]


def walk(admin, path: str, key: str, params, limit: int) -> list[dict]:
    rows, cursor = [], None
    for _ in range(100):
        page, cursor = admin.page(path, key, params, limit, cursor)
        assert len(page) <= limit
        rows += page
        if cursor is None:
            return rows
    raise AssertionError("the pages never ended")


@pytest.mark.parametrize("limit", [1, 3, N_JOBS, 100])
def test_job_pages_read_every_job_once_newest_first(admin, jobs, limit):
    got = walk(admin, "/v1/jobs", "jobs", {"team": TEAM}, limit)
    assert [j["id"] for j in got] == jobs
    assert admin.jobs(team=TEAM, limit=limit) == got[:limit]
    assert [j["id"] for j in admin.jobs(team=TEAM, limit=limit, every=True)] == jobs


def test_status_filter_pages(admin, jobs):
    got = walk(admin, "/v1/jobs", "jobs", [("team", TEAM), ("status", "CANCELLED")], 2)
    assert [j["id"] for j in got] == jobs
    assert walk(admin, "/v1/jobs", "jobs", [("team", TEAM), ("status", "RUNNING")], 2) == []


def test_events_nodes_and_tokens_page_too(admin, jobs):
    events = walk(admin, "/v1/events", "events", {"object_id": jobs[0]}, 1)
    assert [e["type"] for e in events][:1] == ["JobSubmitted"]
    assert [e["id"] for e in events] == sorted(e["id"] for e in events)
    nodes = walk(admin, "/v1/nodes", "nodes", (), 1)
    assert sorted(n["node_id"] for n in nodes) == [n["node_id"] for n in nodes]
    assert {n["node_id"] for n in nodes} == {n["node_id"] for n in admin.nodes()}
    tokens = walk(admin, "/v1/tokens", "tokens", {"all": "true"}, 2)
    assert [t["id"] for t in tokens] == sorted(t["id"] for t in tokens)
    assert len(tokens) == len(admin.tokens(all_users=True))


@pytest.mark.parametrize(
    "path", ["/v1/jobs", "/v1/events", "/v1/nodes", "/v1/tokens", "/v1/services", "/v1/artifacts"]
)
def test_bad_limit_and_cursor_are_refused_naming_the_field(control_plane, path):
    headers = {"Authorization": f"Bearer {control_plane.admin_token}"}

    def get(**params) -> httpx.Response:
        return httpx.get(control_plane.url + path, params=params, headers=headers, timeout=30)

    for limit in ("0", "1001", "many"):
        r = get(limit=limit)
        assert r.status_code == 422 and r.json()["detail"]["field"] == "limit", r.text
    for cursor in ("%%%", "bm90IGpzb24", "WyJhdWRpdCIsMV0"):  # not base64; not JSON; audit's
        r = get(cursor=cursor)
        assert r.status_code == 400 and r.json()["detail"]["field"] == "cursor", r.text
    first = get(limit="1")
    assert first.status_code == 200 and "next_cursor" in first.json()


def test_the_cli_pages_with_limit_and_all_pages(control_plane, jobs):
    base = ["--url", control_plane.url, "--token", control_plane.admin_token, "-o", "json"]
    runner = CliRunner()
    one = runner.invoke(app, ["jobs", "--team", TEAM, "--limit", "2", *base])
    assert one.exit_code == 0, one.output
    assert [j["id"] for j in json.loads(one.stdout)] == jobs[:2]
    every = runner.invoke(app, ["jobs", "--team", TEAM, "--limit", "2", "--all-pages", *base])
    assert every.exit_code == 0, every.output
    assert [j["id"] for j in json.loads(every.stdout)] == jobs
    bad = runner.invoke(app, ["jobs", "--limit", "0", *base])
    assert bad.exit_code != 0 and "--limit" in bad.output
