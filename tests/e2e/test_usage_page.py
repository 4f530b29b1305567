"""The dashboard's Usage page in headless Chromium against the real control plane: the
numbers it draws are the numbers the API returns.

Two teams run real GPU jobs under a price an admin set through the API (team B's jobs
queue behind team A's, so they wait); the accountant writes their ledger lines. A test
cannot wait a month, so the two weeks before today are written into the same ledger as
the accountant writes it (UsageStore.add_lines, lines and daily sums in one transaction)
for the charts to have history. Then the page, as an admin, shows each team's GPU-hours,
cost this month, the top jobs by cost and the queue waits of /v1/usage and
/v1/usage/series, as text and as chart marks; a member sees their own team only. The
admin's view is saved as usage.png ($AICLUSTER_SCREENSHOTS, or a temporary folder).
"""

from __future__ import annotations

import random
import time

import httpx
import pytest

# The dashboard tests' Chromium fixtures (browser, page, screenshots) and helpers.
from test_dashboard import browser, expect, login, page, screenshots

from harness import wait_for

TEAMS = ("usage-a", "usage-b")
GPU_HOUR = 2.5  # USD per GPU-hour, every pool and model; CPU and memory free
DAY = 86400
BUDGETS = {"usage-a": 600.0, "usage-b": 150.0}  # USD a month
HISTORY_JOBS = {"usage-a": ("pretrain-1b", "llama-finetune"), "usage-b": ("eval-sweep", "distill")}


def job(name: str, team: str, gpus: int, seconds: float) -> dict:
    return {
        "kind": "job",
        "name": name,
        "team": team,
        "resources": {"cpus": 1, "gpus": gpus},
        "command": f"sleep {seconds}",
    }


def history_line(i: int, team: str, day: int, gpu_hours: float) -> dict:
    """A ledger line as the accountant writes it, for an attempt that ended on `day`."""
    ended = day * DAY + 13 * 3600 + i
    gpus = 8
    run_ms = round(gpu_hours * 3.6e6 / gpus)
    return dict(
        job_id=f"{HISTORY_JOBS[team][i % 2]}-{(day * 131 + i) % 16**7:07x}",
        attempt=1,
        team=team,
        user=f"user-{team}",
        pool="gpu",
        gpu_model="A100",
        nodes=["history"],
        workers=1,
        gpus=gpus,
        cpus=8.0,
        memory=64 * 2**30,
        admitted_at=ended - run_ms / 1000 - 60,
        started_at=ended - run_ms / 1000,
        ended_at=float(ended),
        end_reason="completed",
        run_ms=run_ms,
        gpu_ms=gpus * run_ms,
        cpu_ms=8 * run_ms,
        memory_gib_ms=64 * run_ms,
        gpu_hour=GPU_HOUR,
        cpu_hour=0.0,
        memory_gib_hour=0.0,
        price_source="set",
        cost_micros=round(gpus * run_ms * GPU_HOUR / 3.6),
        accounted_at=float(ended),
    )


def write_history(cp) -> None:
    from aicluster.store import open_store
    from aicluster.store.usage import UsageStore

    state = (cp.env or {}).get("AICLUSTER_STATE") or cp.home / "state.db"
    store = open_store(state)
    try:
        today = int(time.time() // DAY)
        rnd = random.Random(14)
        lines = []
        for back in range(14, 0, -1):
            for k, team in enumerate(TEAMS):
                if rnd.random() < 0.85:
                    hours = rnd.uniform(20, 90) if k == 0 else rnd.uniform(5, 45)
                    lines.append(history_line(len(lines), team, today - back, round(hours, 1)))
        UsageStore(store).add_lines(lines)
    finally:
        store.close()


@pytest.fixture(scope="module")
def members(dashboard_admin, dashboard_cp):
    for team in TEAMS:
        if team not in dashboard_admin.teams():
            dashboard_admin.create_team(team)
    return {
        team: dashboard_cp.client(dashboard_admin.create_token(f"user-{team}", team=team)["token"])
        for team in TEAMS
    }


@pytest.fixture(scope="module")
def usage_world(dashboard_cp, dashboard_admin, members):
    """Real jobs of both teams, priced and accounted, plus two weeks of ledger history."""
    rates = {"gpu_hour": GPU_HOUR, "cpu_hour": 0, "memory_gib_hour": 0}
    dashboard_admin.request_json("PUT", "/v1/prices", json=rates)
    a, b = members["usage-a"], members["usage-b"]
    jobs = [a.submit(job(f"finetune-{i}", "usage-a", 2, 3)) for i in range(2)]
    jobs += [b.submit(job(f"eval-{i}", "usage-b", 1, 1.5)) for i in range(2)]
    for j in jobs:
        members[j["team"]].wait(j["id"], {"SUCCEEDED"}, timeout=120)

    def accounted() -> bool:
        got = dashboard_admin.request_json("GET", "/v1/usage", params={"since": "1h", "by": "job"})[
            "groups"
        ]
        return {j["id"] for j in jobs} <= {g["key"] for g in got}

    wait_for(accounted, timeout=60, what="ledger lines of every job")
    write_history(dashboard_cp)
    for team, monthly in BUDGETS.items():  # team B's history has spent more than this
        dashboard_admin.request_json("PUT", f"/v1/budgets/{team}", json={"monthly_usd": monthly})
    return jobs


def api(client, path: str, **params) -> dict:
    return client.request_json("GET", path, params=params)


def month_start() -> str:
    return time.strftime("%Y-%m-01", time.gmtime())


def close(text: str, value: float) -> bool:
    """The text shows `value` to the precision the page rounds to (3 significant digits)."""
    shown = float(text.replace("$", "").split()[0])
    return abs(shown - value) <= max(abs(value) * 0.006, 0.006 if abs(value) >= 1 else 0)


def open_usage(page, cp, token: str) -> None:
    login(page, cp, token)
    expect(page.get_by_test_id("dashboard")).to_be_visible()
    page.get_by_test_id("nav-usage").click()
    expect(page.get_by_test_id("usage-stat-gpu-hours")).to_be_visible()


def value(locator) -> float:
    return float(locator.get_attribute("data-value"))


def test_usage_page_shows_the_numbers_the_api_returns(
    page,
    dashboard_cp,
    dashboard_admin,
    usage_world,
    screenshots,
):
    gpu = api(dashboard_admin, "/v1/usage/series", since="30d", step="1d", metric="gpu_hours")
    wait = api(dashboard_admin, "/v1/usage/series", since="30d", step="1d", metric="queue_wait_s")
    month = api(dashboard_admin, "/v1/usage", since=month_start(), by="team")
    top = api(dashboard_admin, "/v1/usage", since="30d", by="job")["groups"][:10]
    assert set(TEAMS) <= {s["team"] for s in gpu["series"]}
    assert set(TEAMS) <= {s["team"] for s in wait["series"]}
    open_usage(page, dashboard_cp, dashboard_cp.admin_token)

    # GPU-hours per team: the table under the chart, and one bar segment per team-day.
    rows = page.get_by_test_id("usage-gpu-row")
    expect(rows).to_have_count(len(gpu["series"]))
    for s in gpu["series"]:
        cell = page.locator(f'[data-testid="usage-gpu-row"][data-team="{s["team"]}"]')
        hours = cell.get_by_test_id("usage-gpu-hours")
        assert value(hours) == pytest.approx(s["total"], rel=1e-12)
        assert close(hours.inner_text(), s["total"]), (hours.inner_text(), s["total"])
        marks = page.locator(f'[data-testid="usage-gpu-chart"] rect[data-team="{s["team"]}"]')
        days = [(t, v) for t, v in s["points"] if v]
        expect(marks).to_have_count(len(days))
        drawn = sorted(float(m.get_attribute("data-value")) for m in marks.all())
        assert drawn == pytest.approx(sorted(v for _, v in days), rel=1e-12)
        if days:  # a team whose jobs held no GPU has no bar
            newest = marks.last.locator("title").text_content()
            assert newest.startswith(s["team"]) and "GPU-h" in newest
    total = value(page.get_by_test_id("usage-stat-gpu-hours"))
    assert total == pytest.approx(sum(s["total"] for s in gpu["series"]), rel=1e-12)

    # Cost this month per team (against its budget where it has one).
    for g in month["groups"]:
        row = page.locator(f'[data-testid="usage-cost-row"][data-team="{g["key"]}"]')
        spent = row.get_by_test_id("usage-cost-spent")
        assert value(spent) == pytest.approx(g["cost"], rel=1e-12)
        assert close(spent.inner_text(), g["cost"]), (spent.inner_text(), g["cost"])
    budgets = api(dashboard_admin, "/v1/budgets")["budgets"]
    assert {b["team"]: b["monthly_usd"] for b in budgets if b["team"] in TEAMS} == BUDGETS
    for b in budgets:
        row = page.locator(f'[data-testid="usage-cost-row"][data-team="{b["team"]}"]')
        assert value(row.get_by_test_id("usage-budget")) == b["monthly_usd"]
        expect(row.locator(".hbar-budget")).to_have_count(1)
    assert value(page.get_by_test_id("usage-stat-month-cost")) == pytest.approx(
        month["total"]["cost"], rel=1e-12
    )

    # The top jobs by cost, in the API's order.
    shown = page.get_by_test_id("usage-top-jobs-row")
    expect(shown).to_have_count(len(top))
    assert [r.get_attribute("data-key") for r in shown.all()] == [g["key"] for g in top]
    costs = page.get_by_test_id("usage-top-jobs-cost").all()
    assert [value(c) for c in costs] == pytest.approx([g["cost"] for g in top], rel=1e-12)

    # Queue wait per team: mean, max and admissions; a point per day that had admissions.
    for s in wait["series"]:
        row = page.locator(f'[data-testid="usage-wait-row"][data-team="{s["team"]}"]')
        assert value(row.get_by_test_id("usage-wait-mean")) == pytest.approx(s["total"])
        assert value(row.get_by_test_id("usage-wait-max")) == pytest.approx(s["max_s"])
        assert value(row.get_by_test_id("usage-wait-count")) == s["count"]
        dots = page.locator(f'[data-testid="usage-wait-chart"] circle[data-team="{s["team"]}"]')
        expect(dots).to_have_count(sum(1 for _, v in s["points"] if v is not None))
    page.screenshot(path=screenshots / "usage.png", full_page=True)


def test_a_member_sees_only_their_own_teams_usage(
    page, dashboard_cp, members, usage_world, screenshots
):
    mine = members["usage-b"]
    gpu = api(mine, "/v1/usage/series", since="30d", step="1d", metric="gpu_hours")
    assert [s["team"] for s in gpu["series"]] == ["usage-b"]
    open_usage(page, dashboard_cp, mine.token)
    expect(page.get_by_test_id("usage-gpu-row")).to_have_count(1)
    row = page.locator('[data-testid="usage-gpu-row"][data-team="usage-b"]')
    assert value(row.get_by_test_id("usage-gpu-hours")) == pytest.approx(gpu["series"][0]["total"])
    expect(page.get_by_test_id("usage-cost-team")).to_have_text(["usage-b"])
    expect(page.get_by_test_id("usage-wait-row")).to_have_count(1)
    expect(page.locator('[data-team="usage-a"]')).to_have_count(0)
    expect(page.get_by_test_id("view")).not_to_contain_text("usage-a")
    page.screenshot(path=screenshots / "usage-member.png", full_page=True)


def scrape(cp, token: str) -> dict[str, float]:
    """The usage families of /metrics: {'name{labels}': value}."""
    r = httpx.get(cp.url + "/metrics", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    out = {}
    for line in r.text.splitlines():
        if line.startswith(("aicluster_usage_", "aicluster_queue_wait_seconds_")):
            name, _, v = line.rpartition(" ")
            out[name] = float(v)
    return out


def test_prometheus_says_what_the_api_says(dashboard_cp, dashboard_admin, members, usage_world):
    """The Grafana panels' counters: all-time GPU-seconds and cost per team are the
    ledger's, and the queue-wait histogram counted every admission /v1/usage/series did;
    a member's scrape holds its own team's series alone."""
    admin = scrape(dashboard_cp, dashboard_cp.admin_token)
    for team in TEAMS:
        total = api(dashboard_admin, "/v1/usage", since="520w", team=team)["total"]
        got = admin[f'aicluster_usage_gpu_seconds_total{{team="{team}"}}']
        assert got == pytest.approx(total["gpu_seconds"])
        got = admin[f'aicluster_usage_cost_usd_total{{team="{team}"}}']
        assert got == pytest.approx(total["cost"])
        (waits,) = api(
            dashboard_admin, "/v1/usage/series", since="1d", metric="queue_wait_s", team=team
        )["series"]
        assert admin[f'aicluster_queue_wait_seconds_count{{team="{team}"}}'] == waits["count"]
        assert admin[f'aicluster_queue_wait_seconds_sum{{team="{team}"}}'] == pytest.approx(
            waits["total"] * waits["count"]
        )
    mine = scrape(dashboard_cp, members["usage-b"].token)
    assert mine and all('team="usage-b"' in name for name in mine), sorted(mine)


@pytest.mark.parametrize(
    "params,status,field",
    [
        ({"metric": "watts"}, 400, "metric"),
        ({"since": "7x"}, 400, "since"),
        ({"step": "6h", "metric": "cost_usd"}, 400, "step"),  # the ledger's sums are daily
        ({"step": "1m", "since": "30d", "metric": "queue_wait_s"}, 400, "step"),  # too many
        ({"step": "x" * 17}, 422, "step"),
        ({"team": "no-such-team"}, 404, None),
    ],
)
def test_bad_series_queries_name_the_field(dashboard_cp, params, status, field):
    r = httpx.get(
        dashboard_cp.url + "/v1/usage/series",
        params=params,
        headers={"Authorization": f"Bearer {dashboard_cp.admin_token}"},
    )
    assert r.status_code == status, r.text
    if field is not None:
        assert r.json()["detail"]["field"] == field
    assert httpx.get(dashboard_cp.url + "/v1/usage/series").status_code == 401
