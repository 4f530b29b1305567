"""A job's name works wherever its id does: the API resolves `GET /v1/jobs/{job_id}`,
`.../cancel` and `.../logs` by id first, then by name (the newest job of that name in the
caller's team, or `TEAM:NAME`), so `aicluster describe|logs|cancel NAME` work too.

A member's name never reaches another team's job (404, as for an unknown id); an admin's
plain name that matches the newest jobs of several teams is a 409 naming them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from harness import TERMINAL, wait_for

pytestmark = pytest.mark.ray

TEAMS = ("names-a", "names-b")


@pytest.fixture(scope="module")
def tokens(admin, control_plane):
    for team in TEAMS:
        if team not in admin.teams():
            admin.create_team(team)
    return {
        "a": admin.create_token("names-alice", team="names-a")["token"],
        "b": admin.create_token("names-bob", team="names-b")["token"],
        "viewer": admin.create_token("names-vera", team="names-a", role="viewer")["token"],
        "admin": control_plane.admin_token,
    }


@pytest.fixture
def api(control_plane, tokens):
    """`api(who, method, path, **kw)`: one call to the control plane as `who`."""
    sent: list[str] = []

    def call(who: str, method: str, path: str, **kw) -> httpx.Response:
        headers = {"Authorization": f"Bearer {tokens[who]}"}
        return httpx.request(method, control_plane.url + path, headers=headers, timeout=30, **kw)

    def submit(who: str, team: str, name: str, command: str) -> dict:
        spec = {
            "kind": "job",
            "name": name,
            "team": team,
            "command": command,
            "resources": {"cpus": 1},
        }
        r = call(who, "POST", "/v1/jobs", json={"spec": spec})
        assert r.status_code == 201, r.text
        sent.append(r.json()["id"])
        return r.json()

    call.submit = submit
    yield call
    for job_id in sent:  # free the cluster for the tests that follow
        call("admin", "POST", f"/v1/jobs/{job_id}/cancel")


def unique(prefix: str) -> str:
    return f"{prefix}-{os.urandom(3).hex()}"


def status_of(api, who: str, ref: str) -> str:
    r = api(who, "GET", f"/v1/jobs/{ref}")
    assert r.status_code == 200, r.text
    return r.json()["status"]


def wait_status(api, job_id: str, wanted: set[str], timeout: float = 90) -> None:
    wait_for(
        lambda: status_of(api, "admin", job_id) in wanted,
        timeout,
        0.2,
        f"{job_id} in {sorted(wanted)}",
    )


def log_text(api, who: str, ref: str) -> str:
    r = api(who, "GET", f"/v1/jobs/{ref}/logs")
    assert r.status_code == 200, r.text
    return r.text


def test_get_logs_and_cancel_by_name_through_the_api(api):
    name = unique("nm-api")
    job = api.submit("a", "names-a", name, f"echo hello-{name}; sleep 600")
    wait_status(api, job["id"], {"RUNNING"})

    got = api("a", "GET", f"/v1/jobs/{name}")
    assert got.status_code == 200, got.text
    assert (got.json()["id"], got.json()["name"]) == (job["id"], name)
    assert got.json()["events"], "the job's own events come with it, as by id"
    assert api("a", "GET", f"/v1/jobs/names-a:{name}").json()["id"] == job["id"]
    wait_for(lambda: f"hello-{name}" in log_text(api, "a", name), 60, 0.2, "rank 0's log by name")
    logs = api("a", "GET", f"/v1/jobs/{name}/logs", params={"rank": 0})
    assert logs.headers["X-Job-Status"] == "RUNNING"
    assert logs.headers["X-Attempt"] == str(got.json()["attempt"])

    assert api("viewer", "POST", f"/v1/jobs/{name}/cancel").status_code == 403
    cancelled = api("a", "POST", f"/v1/jobs/{name}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    assert (cancelled.json()["id"], cancelled.json()["status"]) == (job["id"], "CANCELLED")
    wait_status(api, job["id"], TERMINAL, 30)
    assert status_of(api, "a", name) == "CANCELLED"


def test_newest_of_two_same_named_jobs_wins(api):
    name = unique("nm-twice")
    first = api.submit("a", "names-a", name, f"echo first-{name}")
    wait_status(api, first["id"], TERMINAL)
    second = api.submit("a", "names-a", name, f"echo second-{name}; sleep 600")
    wait_status(api, second["id"], {"RUNNING"})

    assert api("a", "GET", f"/v1/jobs/{name}").json()["id"] == second["id"]
    assert api("admin", "GET", f"/v1/jobs/{name}").json()["id"] == second["id"]
    wait_for(lambda: f"second-{name}" in log_text(api, "a", name), 60, 0.2, "the newest's log")
    assert f"first-{name}" not in log_text(api, "a", name)
    assert f"first-{name}" in log_text(api, "a", first["id"]), "an id still names the older job"

    assert api("a", "POST", f"/v1/jobs/{name}/cancel").json()["id"] == second["id"]
    wait_status(api, second["id"], {"CANCELLED"}, 30)
    assert status_of(api, "a", first["id"]) == "SUCCEEDED", "only the newest was cancelled"


def test_a_member_cannot_reach_another_teams_job_by_name(api):
    name = unique("nm-private")
    job = api.submit("a", "names-a", name, f"echo secret-{name}; sleep 600")
    wait_status(api, job["id"], {"RUNNING"})
    unknown = api("b", "GET", f"/v1/jobs/{unique('nm-nosuch')}")
    assert unknown.status_code == 404

    for ref in (name, f"names-a:{name}"):
        for method, path in (
            ("GET", f"/v1/jobs/{ref}"),
            ("GET", f"/v1/jobs/{ref}/logs"),
            ("POST", f"/v1/jobs/{ref}/cancel"),
        ):
            r = api("b", method, path)
            assert r.status_code == 404, (method, path, r.text)
            assert r.json()["detail"]["message"] == f"job {ref} not found"
            assert job["id"] not in r.text and "names-a" not in r.text.replace(ref, "")
    assert status_of(api, "a", name) == "RUNNING", "bob's cancel by name reached nothing"

    # Bob's own job of the same name is what the name means for him: no ambiguity for members.
    own = api.submit("b", "names-b", name, "true")
    assert api("b", "GET", f"/v1/jobs/{name}").json()["id"] == own["id"]
    assert api("a", "GET", f"/v1/jobs/{name}").json()["id"] == job["id"]
    assert api("b", "GET", f"/v1/jobs/names-b:{name}").json()["id"] == own["id"]


def test_an_admins_name_in_two_teams_is_a_409_naming_the_candidates(api):
    name = unique("nm-both")
    job_a = api.submit("a", "names-a", name, "sleep 600")
    job_b = api.submit("b", "names-b", name, "sleep 600")
    for method, path in (
        ("GET", f"/v1/jobs/{name}"),
        ("GET", f"/v1/jobs/{name}/logs"),
        ("POST", f"/v1/jobs/{name}/cancel"),
    ):
        r = api("admin", method, path)
        assert r.status_code == 409, (method, path, r.text)
        detail = r.json()["detail"]
        assert "ambiguous" in detail["message"] and "TEAM:NAME" in detail["message"]
        for job, team in ((job_a, "names-a"), (job_b, "names-b")):
            assert f"{job['id']} (team {team})" in detail["message"]
        assert detail["field"] == "job_id"
        assert detail["candidates"] == [
            {"id": job_b["id"], "team": "names-b"},
            {"id": job_a["id"], "team": "names-a"},
        ]
    for job in (job_a, job_b):
        assert status_of(api, "admin", job["id"]) != "CANCELLED", "an ambiguous cancel did nothing"

    # The id, or TEAM:NAME, settles it.
    assert api("admin", "GET", f"/v1/jobs/names-a:{name}").json()["id"] == job_a["id"]
    cancelled = api("admin", "POST", f"/v1/jobs/names-b:{name}/cancel").json()
    assert (cancelled["id"], cancelled["status"]) == (job_b["id"], "CANCELLED")
    assert api("admin", "GET", f"/v1/jobs/{job_a['id']}").json()["team"] == "names-a"
    assert api("admin", "GET", f"/v1/jobs/nosuch-team:{name}").status_code == 404
    # A name found in one team alone resolves for an admin as well.
    only = unique("nm-only")
    job_o = api.submit("b", "names-b", only, "true")
    assert api("admin", "GET", f"/v1/jobs/{only}").json()["id"] == job_o["id"]


def test_openapi_declares_409_for_the_job_routes(control_plane):
    paths = httpx.get(control_plane.url + "/openapi.json").json()["paths"]
    for path, method in (
        ("/v1/jobs/{job_id}", "get"),
        ("/v1/jobs/{job_id}/cancel", "post"),
        ("/v1/jobs/{job_id}/logs", "get"),
    ):
        op = paths[path][method]
        assert {"404", "409"} <= set(op["responses"]), (path, sorted(op["responses"]))
        (param,) = [p for p in op["parameters"] if p["name"] == "job_id"]
        assert "TEAM:NAME" in param["description"]


def cli(control_plane, token: str, tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        AICLUSTER_URL=control_plane.url,
        AICLUSTER_TOKEN=token,
        AICLUSTER_HOME=str(tmp_path / "cli-home"),
        NO_COLOR="1",
        COLUMNS="200",
    )
    return subprocess.run(
        [sys.executable, "-m", "aicluster.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_describe_logs_and_cancel_by_name(api, control_plane, tokens, tmp_path):
    name = unique("nm-cli")
    older = api.submit("a", "names-a", name, f"echo older-{name}")
    wait_status(api, older["id"], TERMINAL)
    job = api.submit("a", "names-a", name, f"echo cli-{name}; sleep 600")
    wait_status(api, job["id"], {"RUNNING"})
    wait_for(lambda: f"cli-{name}" in log_text(api, "a", job["id"]), 60, 0.2, "the job's log")
    alice = tokens["a"]

    res = cli(control_plane, alice, tmp_path, "describe", name, "-o", "json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["id"] == job["id"]
    res = cli(control_plane, alice, tmp_path, "describe", name)
    assert res.returncode == 0 and job["id"] in res.stdout and "RUNNING" in res.stdout, res

    res = cli(control_plane, alice, tmp_path, "logs", name)
    assert res.returncode == 0, res.stderr
    assert f"cli-{name}" in res.stdout and f"older-{name}" not in res.stdout
    res = cli(control_plane, alice, tmp_path, "logs", f"names-a:{name}")
    assert res.returncode == 0 and f"cli-{name}" in res.stdout, res

    # Bob, of another team, gets what an unknown job gets.
    for cmd in ("describe", "logs", "cancel"):
        res = cli(control_plane, tokens["b"], tmp_path, cmd, name)
        assert res.returncode == 1 and f"job {name} not found" in res.stderr, (cmd, res)
        assert job["id"] not in res.stdout + res.stderr

    res = cli(control_plane, alice, tmp_path, "cancel", name)
    assert res.returncode == 0, res.stderr
    assert f"cancelled {name}" in res.stdout
    assert status_of(api, "a", job["id"]) == "CANCELLED"
    assert status_of(api, "a", older["id"]) == "SUCCEEDED"


def test_cli_admin_ambiguous_name_says_to_use_the_id_or_team(api, control_plane, tokens, tmp_path):
    name = unique("nm-cli-both")
    job_a = api.submit("a", "names-a", name, "sleep 600")
    job_b = api.submit("b", "names-b", name, "sleep 600")
    for cmd in ("describe", "logs", "cancel"):
        res = cli(control_plane, tokens["admin"], tmp_path, cmd, name)
        assert res.returncode == 1, (cmd, res)
        err = " ".join(res.stderr.split())  # the terminal may wrap the message
        assert "ambiguous" in err and "TEAM:NAME" in err, (cmd, res.stderr)
        assert job_a["id"] in err and job_b["id"] in err
    res = cli(control_plane, tokens["admin"], tmp_path, "cancel", f"names-a:{name}")
    assert res.returncode == 0, res.stderr
    assert status_of(api, "admin", job_a["id"]) == "CANCELLED"
    assert status_of(api, "admin", job_b["id"]) != "CANCELLED"
