"""The usage ledger live: two teams run short jobs; the accountant (a step of the control
plane's loop) writes a line per ended attempt, priced at the rate set before it started;
a service's replicas, scaled down and deleted, get a line per run from placement to stop;
admins see every team's usage, members only their own; totals reconcile with the lines
by team and by service; bad input is a 4xx naming the field."""

from __future__ import annotations

import time

import httpx
import pytest

from aicluster.client.api import ApiError

from harness import team_members, wait_for

pytestmark = pytest.mark.ray
TEAMS = ("use-a", "use-b")


@pytest.fixture(scope="module")
def members(admin, control_plane):
    return team_members(control_plane, admin, TEAMS)


def usage(client, **params) -> dict:
    return client.request_json("GET", "/v1/usage", params={"since": "1d", **params})


def all_lines(client, **params) -> list[dict]:
    out, after = [], 0
    while page := client.request_json(
        "GET", "/v1/usage/lines", params={"since": "1d", "after": after, **params}
    )["lines"]:
        out += page
        after = page[-1]["id"]
    return out


def test_two_teams_usage_is_accounted_scoped_and_reconciles(admin, members):
    price = admin.request_json(
        "PUT", "/v1/prices", json={"pool": "gpu", "gpu_model": "A100", "gpu_hour": 2.5}
    )
    assert price["gpu_hour"] == 2.5 and price["effective_from"] <= time.time()
    jobs = {}
    for team, client in members.items():
        spec = {
            "kind": "job",
            "name": "metered",
            "team": team,
            "resources": {"gpus": 1, "cpus": 1},
            "command": "sleep 1",
        }
        jobs[team] = client.submit(spec)["id"]
    for team, job_id in jobs.items():
        members[team].wait(job_id, {"SUCCEEDED"}, timeout=90)
    wait_for(
        lambda: all(usage(admin, team=t)["total"]["lines"] >= 1 for t in TEAMS),
        timeout=30,
        what="lines for both teams",
    )

    # Admins see both teams; a member only its own, and another team's is not found.
    everyone = {g["key"]: g for g in usage(admin, by="team")["groups"]}
    assert set(TEAMS) <= set(everyone)
    mine = usage(members["use-a"], by="team")
    assert [g["key"] for g in mine["groups"]] == ["use-a"] and mine["team"] == "use-a"
    with pytest.raises(ApiError) as exc:
        usage(members["use-a"], team="use-b")
    assert exc.value.status_code == 404
    assert {x["team"] for x in all_lines(members["use-b"])} == {"use-b"}

    for team, job_id in jobs.items():
        lines = all_lines(admin, team=team)
        (line,) = [x for x in lines if x["job_id"] == job_id]
        (attempt,) = admin.job(job_id)["attempts"]
        assert line["started_at"] == attempt["started_at"]
        assert line["ended_at"] == attempt["ended_at"]
        assert line["run_ms"] == round((attempt["ended_at"] - attempt["started_at"]) * 1000)
        assert line["gpu_ms"] == line["run_ms"] and line["end_reason"] == "completed"
        assert (line["pool"], line["gpu_model"], line["user"]) == ("gpu", "A100", f"user-{team}")
        assert line["gpu_hour"] == 2.5 and line["price_source"] == "set"
        assert line["cost_micros"] == round(line["gpu_ms"] * 2.5 / 3.6)
        # The team's totals are exactly the sums of its lines, by any grouping.
        total = usage(admin, team=team)["total"]
        for field in ("lines", "gpu_ms", "cpu_ms", "memory_gib_ms", "cost_micros"):
            want = len(lines) if field == "lines" else sum(x[field] for x in lines)
            assert total[field] == want, field
            by_user = usage(admin, team=team, by="user")["groups"]
            assert sum(g[field] for g in by_user) == want, field


@pytest.mark.parametrize(
    "params,field",
    [({"since": "7x"}, "since"), ({"by": "nope"}, "by"), ({"since": "x" * 65}, "since")],
)
def test_bad_usage_queries_name_the_field(control_plane, params, field):
    r = httpx.get(
        f"{control_plane.url}/v1/usage",
        params=params,
        headers={"Authorization": f"Bearer {control_plane.admin_token}"},
    )
    assert r.status_code in (400, 422), r.text
    assert r.json()["detail"]["field"] == field


@pytest.mark.parametrize(
    "body,status,field",
    [
        ({}, 400, "gpu_hour"),
        ({"gpu_hour": -1}, 422, "gpu_hour"),
        ({"gpu_hour": 1, "effective_from": 1.0}, 400, "effective_from"),
        ({"gpu_hour": 1, "pool": "Not A Pool"}, 422, "pool"),
        ({"gpu_hour": 1, "colour": "red"}, 422, "colour"),
    ],
)
def test_bad_prices_name_the_field(control_plane, body, status, field):
    r = httpx.put(
        f"{control_plane.url}/v1/prices",
        json=body,
        headers={"Authorization": f"Bearer {control_plane.admin_token}"},
    )
    assert r.status_code == status, r.text
    assert r.json()["detail"]["field"] == field


def test_only_admins_set_prices_and_everyone_reads_them(members):
    with pytest.raises(ApiError) as exc:
        members["use-a"].request_json("PUT", "/v1/prices", json={"gpu_hour": 9.0})
    assert exc.value.status_code == 403
    listed = members["use-a"].request_json("GET", "/v1/prices")
    assert any(d["gpu_model"] == "h100-sxm" for d in listed["defaults"])


def test_the_cli_sets_prices_and_reports_usage(control_plane, members):
    from typer.testing import CliRunner

    from aicluster.cli.main import app

    auth = ["--url", control_plane.url, "--token", control_plane.admin_token]
    run = lambda *args: CliRunner().invoke(app, [*args, *auth])
    done = run("prices", "set", "--gpu-model", "H100", "--gpu-hour", "2.50")
    assert done.exit_code == 0 and "gpu-hour 2.5" in done.output, done.output
    assert "H100" in run("prices", "list").output
    report = run("usage", "--since", "1d", "--by", "team", "-o", "csv")
    assert report.exit_code == 0, report.output
    rows = [r.split(",") for r in report.output.strip().splitlines()]
    assert rows[0][:2] == ["team", "lines"] and rows[-1][0] == "TOTAL"
    assert sum(int(r[1]) for r in rows[1:-1]) == int(rows[-1][1])
    bad = run("usage", "--since", "7x")
    assert bad.exit_code == 1 and "since" in bad.output
    assert run("usage", "--by", "user").exit_code == 0


def test_replica_runs_are_lines_that_reconcile_by_service_and_team(admin, members):
    admin.request_json(
        "PUT", "/v1/prices", json={"pool": "gpu", "gpu_model": "A100", "gpu_hour": 2.5}
    )
    client, name = members["use-a"], "metered-svc"
    spec = {
        "kind": "service",
        "name": name,
        "team": "use-a",
        "model": "sim-model",
        "engine": "simulated",
        "resources": {"gpus": 1, "cpus": 0.5},
        "replicas": {"min": 2, "max": 2},
        "readiness_timeout_s": 60,
    }
    client.deploy(spec)
    ready = lambda: [r for r in client.service(name)["replicas"] if r["status"] == "READY"]
    wait_for(lambda: len(ready()) == 2, timeout=90, what="2 ready replicas")
    rids = sorted(r["id"] for r in ready())
    client.scale(name, 1)  # one replica stops: scaled_down
    live = lambda: [
        r for r in client.service(name)["replicas"] if r["status"] not in ("STOPPED", "FAILED")
    ]
    wait_for(lambda: len(live()) == 1, timeout=30, what="scaled down")
    client.delete_service(name)  # the other stops: deleted
    keys = {f"replica:{r}" for r in rids}
    replica_lines = lambda: [x for x in all_lines(admin, team="use-a") if x["job_id"] in keys]
    wait_for(lambda: len(replica_lines()) == 2, timeout=30, what="2 replica lines")

    lines = replica_lines()
    assert {x["end_reason"] for x in lines} == {"scaled_down", "deleted"}
    for line in lines:
        rid = line["job_id"].removeprefix("replica:")
        events = [e for e in admin.events(object_id=rid) if e["type"] == "ReplicaTransition"]
        (placed,) = [e for e in events if e["to_status"] == "STARTING"]
        (ended,) = [e for e in events if e["to_status"] in ("STOPPED", "FAILED")]
        assert (line["kind"], line["service"], line["user"]) == ("replica", name, "user-use-a")
        assert (line["pool"], line["gpu_model"], line["gpus"]) == ("gpu", "A100", 1)
        assert abs(line["started_at"] - placed["ts"]) < 1 and line["ended_at"] == ended["ts"]
        run_s = ended["ts"] - placed["ts"]
        assert abs(line["run_ms"] / 1000 - run_s) < 1  # to the second
        assert line["gpu_ms"] == line["run_ms"] and line["cpu_ms"] == round(0.5 * line["run_ms"])
        assert line["gpu_hour"] == 2.5
        rates = line["gpu_ms"] * 2.5 + line["cpu_ms"] * line["cpu_hour"]
        rates += line["memory_gib_ms"] * line["memory_gib_hour"]
        assert line["cost_micros"] == round(rates / 3.6)

    by_service = usage(admin, team="use-a", by="service")
    (svc,) = [g for g in by_service["groups"] if g["key"] == name]
    for field in ("lines", "gpu_ms", "cpu_ms", "cost_micros"):
        want = len(lines) if field == "lines" else sum(x[field] for x in lines)
        assert svc[field] == want, field
        assert by_service["total"][field] == sum(g[field] for g in by_service["groups"])
    everything = all_lines(admin, team="use-a")
    (team_a,) = [g for g in usage(admin, by="team")["groups"] if g["key"] == "use-a"]
    assert team_a["gpu_ms"] == sum(x["gpu_ms"] for x in everything)  # jobs and replicas
    assert team_a["lines"] == len(everything) == by_service["total"]["lines"]
    theirs = usage(members["use-b"], by="service")
    assert name not in [g["key"] for g in theirs["groups"]]
    assert {g["key"] for g in theirs["storage"]["groups"]} <= {"use-b"}


def test_the_cli_reports_by_service_with_storage(control_plane, admin):
    from typer.testing import CliRunner

    from aicluster.cli.main import app

    auth = ["--url", control_plane.url, "--token", control_plane.admin_token]
    run = lambda *args: CliRunner().invoke(app, [*args, *auth])
    done = run("prices", "set", "--storage-gib-month", "0.02")
    assert done.exit_code == 0 and "storage-gib-month 0.02" in done.output, done.output
    report = run("usage", "--since", "1d", "--by", "service", "-o", "csv")
    assert report.exit_code == 0, report.output
    rows = [r.split(",") for r in report.output.strip().splitlines()]
    assert rows[0][:2] == ["service", "lines"] and rows[-1][0] == "TOTAL"
    assert sum(int(r[1]) for r in rows[1:-1]) == int(rows[-1][1])
    assert "storage_gib_days" in rows[0]
    assert run("usage", "--by", "service").exit_code == 0
