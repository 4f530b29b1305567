"""The Grafana dashboard only uses metrics the control plane really exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import generate_latest

from aicluster.control.metrics import Metrics, StateCollector
from aicluster.engine.protocol import NodeInfo
from aicluster.gateway.load import ENGINE_SERIES
from aicluster.store.db import open_store

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "aicluster-dashboard.json"


class OneNodeEngine:
    """The engine Protocol's inventory call, answering with one fixed node."""

    def nodes(self):
        return [NodeInfo("n1", "n1", "127.0.0.1", True, 8, 2**34, 4, "A100", "gpu")]


def exported_names(tmp_path) -> set[str]:
    m = Metrics()
    m.add_state(StateCollector(open_store(tmp_path / "s.db"), OneNodeEngine()))
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
    # the engines' own series, re-exported per replica once the gateway has scraped them
    families |= {f"aicluster_engine_{short}" for short in ENGINE_SERIES.values()}
    assert used <= families, used - families
