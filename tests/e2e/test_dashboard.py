"""The web dashboard in Debian's headless Chromium, driven by Playwright, against the
real control plane on a real multi-node Ray cluster.

What a user sees must be what the API says: node and GPU numbers, a job submitted
through the API (live, to SUCCEEDED, with its logs per rank), a service's ready
replicas, the job's transitions in the events stream, and the queue's wait
reasons. Screenshots go to $AICLUSTER_SCREENSHOTS, or a temporary folder.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness import TERMINAL, wait_for

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip(
        "Debian's Chromium is not installed at /usr/bin/chromium (apt-get install chromium)",
        allow_module_level=True,
    )
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')"
)
expect = sync_api.expect

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
HELLO_CMD = (
    "echo hello from rank $RANK; echo '<b>not bold</b>'; "
    "for i in 1 2 3; do echo rank $RANK step $i; sleep 0.3; done; echo done rank $RANK"
)

SET_HIDDEN = """hidden => {
    Object.defineProperty(document, "hidden", {configurable: true, get: () => hidden});
    document.dispatchEvent(new Event("visibilitychange"));
}"""


def job_spec(name: str, command: str, workers: int = 1, gpus: int = 0) -> dict:
    return {
        "kind": "job",
        "name": name,
        "workers": workers,
        "resources": {"cpus": 1, "gpus": gpus},
        "command": command,
    }


def sim_service(name: str, replicas: int) -> dict:
    return {
        "kind": "service",
        "name": name,
        "model": "sim-model",
        "engine": "simulated",
        "resources": {"cpus": 0.5},
        "replicas": {"min": replicas, "max": replicas + 1},
        "readiness_timeout_s": 60,
    }


def is_up(node: dict) -> bool:
    return node["alive"] and node.get("state", "Ready") != "Down"


def num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(round(float(x), 2))


# -- fixtures -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory, pytestconfig) -> Path:
    env = os.environ.get("AICLUSTER_SCREENSHOTS")
    folder = Path(env) if env else tmp_path_factory.mktemp("dashboard-screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    capture = pytestconfig.pluginmanager.get_plugin("capturemanager")
    if capture is not None:
        with capture.global_and_fixture_disabled():
            print(f"\ndashboard screenshots: {folder}")
    else:
        print(f"dashboard screenshots: {folder}")
    return folder


@pytest.fixture(scope="module")
def browser():
    expect.set_options(timeout=20_000)  # a loaded machine answers slowly; conditions, not sleeps
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    """A fresh tab; fails the test on any uncaught script error or CSP violation."""
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
    pg = ctx.new_page()
    pg.set_default_timeout(20_000)
    problems: list[str] = []
    pg.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    pg.on(
        "console",
        lambda m: (
            m.type == "error"
            and "Failed to load resource" not in m.text
            and problems.append(f"console: {m.text}")
        ),
    )
    yield pg
    ctx.close()
    assert not problems, problems


@pytest.fixture(scope="module")
def hello_job(dashboard_admin):
    """A 2-worker job submitted through the API when a test first asks for it."""
    return dashboard_admin.submit(job_spec("dash-hello", HELLO_CMD, workers=2))


def login(page, cp, token: str) -> None:
    page.goto(cp.url + "/")
    expect(page.get_by_test_id("login-screen")).to_be_visible()
    page.get_by_test_id("login-token").fill(token)
    page.get_by_test_id("login-submit").click()


def open_view(page, cp, name: str) -> None:
    login(page, cp, cp.admin_token)
    expect(page.get_by_test_id("dashboard")).to_be_visible()
    page.get_by_test_id(f"nav-{name}").click()


# -- tests ----------------------------------------------------------------------------


def test_wrong_token_is_refused_and_the_page_holds_no_data(page, dashboard_cp, screenshots):
    import httpx

    ui = httpx.get(dashboard_cp.url + "/", follow_redirects=True)
    assert ui.status_code == 200 and ui.url.path == "/ui/"
    assert "text/html" in ui.headers["content-type"]
    assert "default-src 'none'" in ui.headers["content-security-policy"]
    assert httpx.get(dashboard_cp.url + "/v1/nodes").status_code == 401
    for outside in ("/ui/..%2Fstatic%2Fapp.js", "/ui/routes.py", "/ui/.hidden.js"):
        assert httpx.get(dashboard_cp.url + outside).status_code == 404, outside
    login(page, dashboard_cp, "aic_not-a-real-token")
    expect(page.get_by_test_id("login-error")).to_contain_text("rejected")
    expect(page.get_by_test_id("dashboard")).to_be_hidden()
    assert page.evaluate("sessionStorage.getItem('aicluster.token')") is None
    page.screenshot(path=screenshots / "login-error.png")


def test_overview_numbers_match_the_api(page, dashboard_cp, dashboard_admin, screenshots):
    login(page, dashboard_cp, dashboard_cp.admin_token)
    expect(page.get_by_test_id("whoami")).to_contain_text("admin")
    nodes = dashboard_admin.nodes()
    up = [n for n in nodes if is_up(n)]
    total = sum(n["gpus"] for n in nodes)
    down = sum(n["gpus"] for n in nodes if not is_up(n))
    allocated = sum(min(n["gpus"], n["allocated"]["gpus"]) for n in up)
    expect(page.get_by_test_id("node-row")).to_have_count(len(nodes))
    stats = {
        "stat-nodes-total": len(nodes),
        "stat-nodes-up": len(up),
        "stat-gpus-total": total,
        "stat-gpus-allocated": allocated,
        "stat-gpus-free": total - allocated - down,
        "stat-gpus-down": down,
        "stat-pools": len({n["pool"] for n in nodes}),
        "stat-cpus-total": sum(n["cpus"] for n in up),
    }
    for testid, value in stats.items():
        expect(page.get_by_test_id(testid)).to_have_text(num(value))
    assert total > 0, "the test cluster declares GPU nodes"
    for n in nodes:
        row = page.locator(f'[data-testid="node-row"][data-node-id="{n["node_id"]}"]')
        expect(row.get_by_test_id("node-pool")).to_have_text(n["pool"])
        expect(row.get_by_test_id("node-gpus-total")).to_have_text(num(n["gpus"]))
        expect(row.get_by_test_id("node-gpus-allocated")).to_have_text(num(n["allocated"]["gpus"]))
        expect(row.get_by_test_id("node-cpus-total")).to_have_text(num(n["cpus"]))
        expect(row.get_by_test_id("node-gpu-model")).to_have_text(n["gpu_model"] or "—")
        expect(row.get_by_test_id("node-state")).to_have_text(
            n.get("state") or ("Ready" if n["alive"] else "Down")
        )
    for pool in {n["pool"] for n in nodes}:
        row = page.locator(f'[data-testid="pool-row"][data-pool="{pool}"]')
        gpus = sum(n["gpus"] for n in nodes if n["pool"] == pool)
        expect(row.get_by_test_id("pool-gpus-total")).to_have_text(num(gpus))
    ready = sum(1 for n in nodes if n.get("state", "Ready" if n["alive"] else "Down") == "Ready")
    expect(page.get_by_test_id("stat-nodes-ready")).to_have_text(str(ready))
    live = page.get_by_test_id("live-status")
    expect(live).to_contain_text("live")
    page.screenshot(path=screenshots / "overview.png", full_page=True)
    page.evaluate(SET_HIDDEN, True)  # polling stops while the tab is hidden ...
    expect(live).to_have_text("paused (tab hidden)")
    page.evaluate(SET_HIDDEN, False)  # ... and resumes at once when it is shown again
    expect(live).to_contain_text("live")
    page.get_by_test_id("logout").click()
    expect(page.get_by_test_id("login-screen")).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('aicluster.token')") is None


def test_job_submitted_through_the_api_appears_succeeds_and_shows_logs(
    page, dashboard_cp, dashboard_admin, request, screenshots
):
    open_view(page, dashboard_cp, "jobs")
    expect(page.get_by_test_id("jobs-table")).to_be_visible()
    job = request.getfixturevalue("hello_job")  # submitted now, while the table is open
    row = page.locator(f'[data-testid="job-row"][data-job-id="{job["id"]}"]')
    expect(row).to_be_visible()
    row.get_by_test_id("job-link").click()  # follow it live from the job page
    expect(page.get_by_test_id("job-detail-name")).to_have_text("dash-hello")
    expect(page.get_by_test_id("job-detail-status")).to_have_text("SUCCEEDED", timeout=60_000)
    logs = page.get_by_test_id("job-logs")
    expect(page.get_by_test_id("log-status")).to_contain_text("complete")
    api_log = dashboard_admin.logs(job["id"], rank=0)[0].decode()
    assert "rank 0 step 3" in api_log
    expect(logs).to_have_text(api_log.strip())
    assert logs.locator("b").count() == 0, "log text must never become markup"
    placed = dashboard_admin.job(job["id"])["placement"]
    expect(page.get_by_test_id("placement-row")).to_have_count(len(placed))
    expect(page.locator('[data-testid="job-event"][data-to="SUCCEEDED"]')).to_have_count(1)
    attempt = page.get_by_test_id("job-attempt")  # one attempt, never interrupted
    expect(attempt).to_have_count(1)
    expect(attempt.get_by_test_id("job-attempt-end")).to_have_text("completed")
    expect(attempt.get_by_test_id("job-attempt-recovery")).to_have_text("—")
    page.screenshot(path=screenshots / "job.png", full_page=True)
    page.locator('[data-testid="log-rank-tab"][data-rank="1"]').click()
    expect(logs).to_contain_text("done rank 1")
    expect(logs).not_to_contain_text("hello from rank 0")
    page.get_by_test_id("nav-jobs").click()
    expect(row.get_by_test_id("job-status")).to_have_text("SUCCEEDED")
    page.screenshot(path=screenshots / "jobs.png", full_page=True)


def test_queue_shows_pending_jobs_with_their_wait_reason(
    page, dashboard_cp, dashboard_admin, screenshots
):
    job = dashboard_admin.submit(job_spec("dash-too-big", "true", gpus=8))
    try:
        pending = wait_for(
            lambda: (j := dashboard_admin.job(job["id"]))["message"] and j,
            timeout=30,
            what="a wait reason",
        )
        assert pending["status"] == "PENDING"
        open_view(page, dashboard_cp, "queue")
        team = page.locator('[data-testid="queue-team"][data-team="default"]')
        entry = team.locator(f'[data-testid="queue-job"][data-job-id="{job["id"]}"]')
        expect(entry.get_by_test_id("queue-job-message")).to_have_text(pending["message"])
        queued = dashboard_admin.jobs(status=["PENDING"], team="default")
        wanted = sum(j["workers"] * j["spec"].get("resources", {}).get("gpus", 0) for j in queued)
        expect(team.get_by_test_id("queue-pending-count")).to_have_text(str(len(queued)))
        expect(team.get_by_test_id("queue-gpus-wanted")).to_have_text(str(wanted))
        page.screenshot(path=screenshots / "queue.png", full_page=True)
    finally:
        dashboard_admin.cancel(job["id"])


def test_service_shows_its_ready_replicas(page, dashboard_cp, dashboard_admin, screenshots):
    dashboard_admin.deploy(sim_service("dash-chat", replicas=2))
    try:
        open_view(page, dashboard_cp, "services")
        card = page.locator('[data-testid="service-card"][data-service="dash-chat"]')
        expect(card.get_by_test_id("service-ready")).to_have_text("2", timeout=90_000)
        ready = [
            r for r in dashboard_admin.service("dash-chat")["replicas"] if r["status"] == "READY"
        ]
        assert len(ready) == 2
        for r in ready:
            rep = card.locator(f'[data-testid="replica-row"][data-replica-id="{r["id"]}"]')
            expect(rep.get_by_test_id("replica-status")).to_have_text("READY")
            expect(rep.get_by_test_id("replica-url")).to_have_text(r["url"])
            assert r["url"].startswith("http://127.0.0.1:")
        expect(card.get_by_test_id("service-ongoing")).to_have_text("0")
        page.screenshot(path=screenshots / "services.png", full_page=True)
        page.get_by_test_id("nav-overview").click()  # the replicas' CPUs are allocated there
        nodes = dashboard_admin.nodes()
        cpus = sum(n["allocated"]["cpus"] for n in nodes if is_up(n))
        assert cpus >= 1.0
        expect(page.get_by_test_id("stat-cpus-allocated")).to_have_text(num(cpus))
        for r in ready:
            row = page.locator(f'[data-testid="node-row"][data-node-id="{r["node_id"]}"]')
            expect(row.get_by_test_id("node-cpus-allocated")).not_to_have_text("0")
        page.screenshot(path=screenshots / "overview-live.png", full_page=True)
    finally:
        dashboard_admin.delete_service("dash-chat")


def test_events_view_shows_the_job_transitions(
    page, dashboard_cp, dashboard_admin, hello_job, screenshots
):
    done = dashboard_admin.wait(hello_job["id"], TERMINAL, timeout=60)
    assert done["status"] == "SUCCEEDED", done
    api_events = dashboard_admin.events(object_id=hello_job["id"])
    assert {"RUNNING", "SUCCEEDED"} <= {e["to_status"] for e in api_events}
    open_view(page, dashboard_cp, "events")
    page.get_by_test_id("events-search").fill(hello_job["id"])
    rows = page.locator(f'[data-testid="event-row"][data-object-id="{hello_job["id"]}"]')
    expect(rows).to_have_count(len(api_events))
    for e in api_events:
        row = page.locator(f'[data-testid="event-row"][data-event-id="{e["id"]}"]')
        expect(row.get_by_test_id("event-type")).to_have_text(e["type"])
        if e["to_status"]:
            expect(row.get_by_test_id("event-transition")).to_contain_text("→ " + e["to_status"])
    page.screenshot(path=screenshots / "events.png", full_page=True)


def test_overview_shows_each_node_s_newest_doctor_verdict(
    page, dashboard_cp, dashboard_admin, screenshots
):
    """A one-worker `aicluster doctor` probe job, judged by the control plane against an
    expectation no CPU reaches: the overview shows that node's verdict and failing check."""
    from aicluster.cli.doctor_cmds import forget

    probe = ["python", "-m", "aicluster.runtime.doctor_probe", "--p2p-bytes=1024"]
    probe += ["--allreduce-bytes=1024", "--storage-bytes=1024", "--mem-bytes=1048576"]
    job = dashboard_admin.submit({"kind": "job", "name": "dash-doctor", "command": probe}, None)
    done = dashboard_admin.wait(job["id"], TERMINAL, timeout=120)
    forget(dashboard_admin, f"{done['team']}/dash-doctor-ckpt")
    assert done["status"] == "SUCCEEDED", done
    unreachable = {"cpu_matmul": {"value": 1e12, "source": "no CPU reaches it"}}
    body = {"job_id": job["id"], "expect": unreachable}
    stored = dashboard_admin.request_json("POST", "/v1/doctor/reports", json=body)
    node = done["placement"][0]
    assert stored["failing_nodes"] == [node], stored
    login(page, dashboard_cp, dashboard_cp.admin_token)
    row = page.locator(f'[data-testid="node-row"][data-node-id="{node}"]')
    expect(row.get_by_test_id("node-doctor")).to_have_text("fail")
    expect(row.get_by_test_id("node-doctor-failing")).to_contain_text("cpu_matmul")
    page.screenshot(path=screenshots / "overview-doctor.png", full_page=True)
