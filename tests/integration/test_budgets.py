"""Team budgets live (the session's control plane and Ray cluster): a team with a tiny
enforced budget runs a job at a set GPU price, crosses its budget and gets exactly one
warning and one over Event; its next job waits with the budget's reason while another
team's job runs; raising the budget lets it run. Members see their own team's budget and
metrics only and cannot set budgets; max_gpus keeps a team's second job waiting and
max_queued_jobs refuses a submit (429) naming the cap; the CLI sets, lists and deletes."""

from __future__ import annotations

import json

import httpx
import pytest

from aicluster.client.api import ApiError

from harness import TERMINAL, team_members, wait_for

pytestmark = pytest.mark.ray
TEAMS = ("bud-a", "bud-b", "bud-c")


@pytest.fixture(scope="module")
def members(admin, control_plane):
    return team_members(control_plane, admin, TEAMS)


def job(team: str, name: str, command: str = "sleep 1", gpus: int = 1) -> dict:
    resources = {"gpus": gpus, "cpus": 1}
    return {"kind": "job", "name": name, "team": team, "resources": resources, "command": command}


def budgets(client) -> dict[str, dict]:
    return {b["team"]: b for b in client.request_json("GET", "/v1/budgets")["budgets"]}


def crossings(admin, team: str) -> list[str]:
    return [
        e["type"]
        for e in admin.events(object_id=team)
        if e["type"] in ("BudgetWarning", "BudgetExceeded")
    ]


def test_a_team_over_its_budget_is_held_once_warned_and_runs_once_raised(admin, members):
    a, b = members["bud-a"], members["bud-b"]
    # As tests/integration/test_usage.py sets it: GPU-seconds on the session's A100s cost.
    admin.request_json(
        "PUT", "/v1/prices", json={"pool": "gpu", "gpu_model": "A100", "gpu_hour": 2.5}
    )
    # $0.001: about 1.4 GPU-seconds at $2.50 an hour
    made = admin.request_json(
        "PUT", "/v1/budgets/bud-a", json={"monthly_usd": 0.001, "enforce": True}
    )
    assert (made["team"], made["warn_at"], made["state"], made["spent_usd"]) == (
        "bud-a",
        0.8,
        "ok",
        0.0,
    )
    first = a.submit(job("bud-a", "spend", "sleep 3"))["id"]
    assert a.wait(first, TERMINAL, timeout=120)["status"] == "SUCCEEDED"
    wait_for(
        lambda: "BudgetExceeded" in crossings(admin, "bud-a"), timeout=60, what="the over Event"
    )

    held = a.submit(job("bud-a", "held"))["id"]
    other = b.submit(job("bud-b", "free"))["id"]
    waiting = wait_for(
        lambda: (j := a.job(held))["wait_kind"] == "budget" and j, timeout=60, what="a budget wait"
    )
    assert waiting["status"] == "PENDING"
    assert waiting["message"].startswith("team bud-a is over its monthly budget: $0.00")
    assert waiting["message"].endswith(
        "an admin can raise it with `aicluster budgets set bud-a --monthly N`"
    )
    assert b.wait(other, TERMINAL, timeout=120)["status"] == "SUCCEEDED"
    assert a.job(held)["status"] == "PENDING"

    mine = budgets(a)
    assert list(mine) == ["bud-a"] and mine["bud-a"]["state"] == "over"
    assert mine["bud-a"]["used_ratio"] >= 1.0 and mine["bud-a"]["month"] == made["month"]
    assert "bud-a" in budgets(admin) and budgets(b) == {}
    with pytest.raises(ApiError) as exc:
        a.request_json("PUT", "/v1/budgets/bud-a", json={"monthly_usd": 1000.0})
    assert exc.value.status_code == 403
    scrape = lambda client: client.request("GET", "/metrics").text
    assert 'aicluster_team_budget_used_ratio{team="bud-a"}' in scrape(admin)
    assert 'aicluster_team_spent_month_usd{team="bud-a"}' in scrape(a)
    assert "bud-a" not in scrape(b)

    raised = admin.request_json("PUT", "/v1/budgets/bud-a", json={"monthly_usd": 1000.0})
    assert (raised["enforce"], raised["state"]) == (True, "ok")  # enforce kept its value
    assert a.wait(held, TERMINAL, timeout=120)["status"] == "SUCCEEDED"
    assert crossings(admin, "bud-a") == ["BudgetWarning", "BudgetExceeded"]


def test_caps_keep_a_second_job_waiting_and_refuse_a_queue_past_its_cap(
    control_plane, admin, members
):
    c = members["bud-c"]
    admin.request_json(
        "PUT",
        "/v1/budgets/bud-c",
        json={"monthly_usd": 100.0, "max_gpus": 1, "max_queued_jobs": 1},
    )
    running = c.submit(job("bud-c", "capped-1", "sleep 120"))["id"]
    c.wait(running, {"RUNNING"}, timeout=120)
    second = c.submit(job("bud-c", "capped-2"))["id"]
    waiting = wait_for(
        lambda: (j := c.job(second))["wait_kind"] == "team_cap" and j, timeout=60, what="a cap"
    )
    assert "max_gpus cap of 1" in waiting["message"]

    r = httpx.post(
        control_plane.url + "/v1/jobs",
        json={"spec": job("bud-c", "capped-3")},
        headers={"Authorization": f"Bearer {c.token}"},
    )
    assert r.status_code == 429, r.text
    detail = r.json()["detail"]
    assert detail["field"] == "max_queued_jobs"
    assert "team bud-c has 1 pending job(s), its max_queued_jobs cap of 1" in detail["message"]

    admin.request_json("PUT", "/v1/budgets/bud-c", json={"max_gpus": None})
    assert c.wait(second, TERMINAL, timeout=120)["status"] == "SUCCEEDED"  # the cap lifted
    c.cancel(running)
    assert budgets(admin)["bud-c"]["max_gpus"] is None


@pytest.mark.parametrize(
    "body,status,field",
    [
        ({"warn_at": 0.5}, 400, "monthly_usd"),  # a new budget needs its amount
        ({"monthly_usd": 0}, 422, "monthly_usd"),
        ({"monthly_usd": 5, "warn_at": 1.5}, 422, "warn_at"),
        ({"monthly_usd": 5, "max_gpus": -1}, 422, "max_gpus"),
        ({"monthly_usd": 5, "enforce": None}, 400, "enforce"),
        ({"monthly_usd": 5, "colour": "red"}, 422, "colour"),
    ],
)
def test_bad_budgets_name_the_field(control_plane, members, body, status, field):
    r = httpx.put(
        f"{control_plane.url}/v1/budgets/bud-b",
        json=body,
        headers={"Authorization": f"Bearer {control_plane.admin_token}"},
    )
    assert r.status_code == status, r.text
    assert r.json()["detail"]["field"] == field


def test_the_cli_sets_lists_and_deletes_budgets(control_plane, members):
    from typer.testing import CliRunner

    from aicluster.cli.main import app

    auth = ["--url", control_plane.url, "--token", control_plane.admin_token]
    run = lambda *args: CliRunner().invoke(app, [*args, *auth])
    done = run("budgets", "set", "bud-b", "--monthly", "250", "--enforce", "--max-gpus", "2")
    assert done.exit_code == 0, done.output
    assert "team bud-b: $250.00 a month, warn at 80%, enforced, max_gpus 2" in done.output
    done = run("budgets", "set", "bud-b", "--max-gpus", "none", "--warn-at", "0.5")
    assert done.exit_code == 0 and "warn at 50%, enforced, max_gpus -" in done.output, done.output
    listed = run("budgets", "-o", "json")
    assert listed.exit_code == 0, listed.output
    (row,) = [r for r in json.loads(listed.output) if r["team"] == "bud-b"]
    assert (row["monthly_usd"], row["max_gpus"], row["enforce"]) == (250.0, None, True)
    assert "bud-b" in run("budgets").output
    assert run("budgets", "set", "bud-b", "--max-gpus", "many").exit_code != 0
    assert run("budgets", "delete", "bud-b").exit_code == 0
    gone = run("budgets", "delete", "bud-b")
    assert gone.exit_code == 1 and "has no budget" in gone.output
