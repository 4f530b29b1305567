"""The Grafana dashboard only uses metrics the control plane really exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import generate_latest

from aicluster.control.metrics import Metrics, StateCollector
from aicluster.control.usage_metrics import UsageCollector
from aicluster.core.lifecycle import JobStatus, Reason
from aicluster.engine.protocol import NodeInfo
from aicluster.gateway.load import ENGINE_SERIES
from aicluster.specs.job import JobSpec
from aicluster.store.db import open_store
from aicluster.store.usage import UsageStore
from aicluster.store.usage_series import UsageSeriesStore

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "aicluster-dashboard.json"
# Panels that the usage ledger, queue waits and team budgets feed (the Usage page's twins).
USAGE_PANELS = {
    "GPU-hours per team (stacked, per hour)": {"aicluster_usage_gpu_seconds_total"},
    "Cost per team this month vs budget": {
        "aicluster_team_spent_month_usd",
        "aicluster_team_budget_usd",
    },
    "Top teams by cost (dashboard range)": {"aicluster_usage_cost_usd_total"},
    "Queue wait per team (submit or requeue to admission)": {
        "aicluster_queue_wait_seconds_sum",
        "aicluster_queue_wait_seconds_count",
        "aicluster_queue_wait_seconds_bucket",
    },
}


class OneNodeEngine:
    """The engine Protocol's inventory call, answering with one fixed node."""

    def nodes(self):
        return [NodeInfo("n1", "n1", "127.0.0.1", True, 8, 2**34, 4, "A100", "gpu")]


def ledger_line(team: str) -> dict:
    """One ended attempt of a 1-GPU job for an hour, at $2 an hour."""
    ms = 3_600_000
    return dict(
        job_id="j1", attempt=1, team=team, user="u", pool="gpu", gpu_model="A100",
        nodes=["n1"], workers=1, gpus=1, cpus=1.0, memory=2**30, admitted_at=0.0,
        started_at=0.0, ended_at=float(ms // 1000), end_reason="completed", run_ms=ms,
        gpu_ms=ms, cpu_ms=ms, memory_gib_ms=ms, gpu_hour=2.0, cpu_hour=0.0,
        memory_gib_hour=0.0, price_source="set", cost_micros=2_000_000, accounted_at=3600.0,
    )  # fmt: skip


def exported_names(tmp_path) -> set[str]:
    m = Metrics()
    store = open_store(tmp_path / "s.db")
    store.create_team("t")
    UsageStore(store).add_lines([ledger_line("t")])
    job = store.create_job(JobSpec(name="j", team="t", command="true"), "u")
    store.transition(job.id, JobStatus.PENDING, JobStatus.ADMITTED, Reason.ADMITTED)
    m.add_state(StateCollector(store, OneNodeEngine()))
    m.add_state(UsageCollector(UsageSeriesStore(store)))
    m.gateway_requests.labels("t", "s", "r", "200").inc()
    m.recovery_seconds.labels("node_lost").observe(1.0)
    for hist in (m.gateway_latency.labels("t", "s"), m.gateway_ttfb.labels("t", "s", "r")):
        hist.observe(0.1)
    m.cycle_seconds.observe(0.01)
    text = generate_latest(m.registry).decode()
    return {
        line.split("{")[0].split(" ")[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def test_every_dashboard_metric_is_exported(tmp_path):
    dash = json.loads(DASHBOARD.read_text())
    used = set()
    for panel in dash["panels"]:
        for target in panel["targets"]:
            used |= set(re.findall(r"aicluster_[a-z_]+", target["expr"]))
    assert used, "the dashboard queries something"
    names = exported_names(tmp_path)
    # the queue and replica families have samples only when there is something to count
    families = names | {
        "aicluster_queue_length",
        "aicluster_queue_oldest_wait_seconds",
        "aicluster_replicas",
        "aicluster_jobs",
        "aicluster_team_gpus_allocated",
    }
    # the budget gauges have samples only for teams with a budget (test_usage_panels_...
    # checks that the control plane declares them)
    families |= USAGE_PANELS["Cost per team this month vs budget"]
    # the engines' own series, re-exported per replica once the gateway has scraped them
    families |= {f"aicluster_engine_{short}" for short in ENGINE_SERIES.values()}
    assert used <= families, used - families


def test_usage_panels_query_what_the_code_exports(tmp_path):
    """The Usage page's twins: each names the series it needs, and each of those is
    exported (the ledger's and queue waits' here; the budgets' gauges are declared by
    the control plane's metrics when a team has a budget)."""
    dash = json.loads(DASHBOARD.read_text())
    by_title = {p["title"]: p for p in dash["panels"]}
    names = exported_names(tmp_path)
    source = "\n".join(f.read_text() for f in (ROOT / "src" / "aicluster").rglob("*.py"))
    for title, wanted in USAGE_PANELS.items():
        exprs = " ".join(t["expr"] for t in by_title[title]["targets"])
        used = set(re.findall(r"aicluster_[a-z_]+", exprs))
        assert wanted <= used, (title, wanted - used)
        for name in used:
            family = re.sub(r"_(total|sum|count|bucket)$", "", name)
            assert name in names or f'"{family}"' in source, (title, name)
