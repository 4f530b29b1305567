"""Pages of the list routes through the real control plane on loopback (api.paging): each
page holds at most `limit` rows, following `next_cursor` reads every row once in the
list's order and ends with null; a bad `limit` is a 422 and a cursor the list did not hand
out a 400, each naming its field; the client and the CLI's --limit and --all-pages page
the same way. The queue pages too (control.queue_pages): positions over everybody's
entries, a member sees only their team's."""

from __future__ import annotations

import json

import httpx
import pytest
from typer.testing import CliRunner

from aicluster.cli.main import app

from harness import team_members, wait_for

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
    "path",
    [
        "/v1/jobs",
        "/v1/events",
        "/v1/nodes",
        "/v1/tokens",
        "/v1/services",
        "/v1/artifacts",
        "/v1/queue",
    ],
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


QUEUE_TEAMS = ("paging-q1", "paging-q2")


@pytest.fixture(scope="module")
def queued(control_plane, admin):
    """Five jobs that never fit, alternating two teams, in the scheduler's queue; a
    member's client per team. Cancelled at the end."""
    members = team_members(control_plane, admin, QUEUE_TEAMS)
    made = []
    for i in range(5):
        team = QUEUE_TEAMS[i % 2]
        spec = {"kind": "job", "name": f"queued-{i}", "team": team, "command": "true"}
        spec["resources"] = {"gpus": 64}  # never fits the test cluster: it stays PENDING
        made.append(admin.submit(spec)["id"])
    wait_for(
        lambda: set(made) <= {q["workload"] for q in admin.queue(every=True)},
        what="the jobs in the queue",
    )
    yield made, members
    for job_id in made:
        admin.cancel(job_id)


def test_queue_pages_in_order_with_positions_and_a_member_sees_their_own(admin, queued):
    made, members = queued
    paged = walk(admin, "/v1/queue", "queue", (), 1)
    positions = [q["position"] for q in paged]
    assert positions == sorted(set(positions)), positions
    everything = admin.queue(every=True)
    assert [q["workload"] for q in everything] == [q["workload"] for q in paged]
    assert admin.queue(limit=2) == everything[:2]
    assert set(made) <= {q["workload"] for q in paged}
    at = {q["workload"]: q["position"] for q in everything}
    for n, (team, member) in enumerate(members.items()):
        theirs = member.queue(limit=1, every=True)
        assert {q["team"] for q in theirs} == {team}
        assert {q["workload"] for q in theirs} >= set(made[n::2])
        assert all(q["position"] == at[q["workload"]] for q in theirs)  # counted over all


def test_the_cli_pages_the_queue(control_plane, queued):
    base = ["--url", control_plane.url, "--token", control_plane.admin_token, "-o", "json"]
    runner = CliRunner()
    one = runner.invoke(app, ["queue", "--limit", "1", *base])
    assert one.exit_code == 0, one.output
    assert len(json.loads(one.stdout)) == 1
    every = runner.invoke(app, ["queue", "--limit", "2", "--all-pages", *base])
    assert every.exit_code == 0, every.output
    assert set(queued[0]) <= {q["workload"] for q in json.loads(every.stdout)}
    bad = runner.invoke(app, ["queue", "--limit", "0", *base])
    assert bad.exit_code != 0 and "--limit" in bad.output
