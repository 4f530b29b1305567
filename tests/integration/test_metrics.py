"""Prometheus /metrics of the control plane: real numbers from the session cluster."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from harness import wait_for


def scrape(cp) -> dict:
    r = httpx.get(cp.url + "/metrics", headers={"Authorization": f"Bearer {cp.admin_token}"})
    assert r.status_code == 200
    out: dict = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_need_a_token(control_plane):
    assert httpx.get(control_plane.url + "/metrics").status_code == 401


def test_cluster_queue_and_scheduler_metrics(control_plane, admin):
    m = scrape(control_plane)
    assert value(m, "aicluster_nodes", pool="gpu", state="Ready") >= 2
    assert value(m, "aicluster_gpus", pool="gpu", kind="total") >= 4
    assert value(m, "aicluster_scheduler_cycle_seconds_count") > 0
    job = admin.submit({"kind": "job", "name": "metered", "command": "exit 4"}, None)
    admin.wait(job["id"], {"FAILED"}, timeout=60)
    m = scrape(control_plane)
    assert value(m, "aicluster_jobs", status="FAILED", reason="exit_code") >= 1


def test_gateway_and_replica_metrics(control_plane):
    headers = {"Authorization": f"Bearer {control_plane.admin_token}"}
    spec = {
        "kind": "service",
        "name": "metered",
        "model": "m",
        "engine": "simulated",
        "resources": {"cpus": 0.5},
        "replicas": {"min": 1, "max": 1},
    }
    assert (
        httpx.post(
            control_plane.url + "/v1/services", json={"spec": spec}, headers=headers
        ).status_code
        == 201
    )
    wait_for(
        lambda: (
            value(
                scrape(control_plane),
                "aicluster_replicas",
                team="default",
                service="metered",
                status="READY",
            )
            == 1
        ),
        timeout=90,
        what="ready",
    )
    for i in range(3):
        r = httpx.post(
            control_plane.url + "/v1/completions",
            headers=headers,
            json={"model": "metered", "prompt": f"p{i}", "max_tokens": 2},
        )
        assert r.status_code == 200
    m = scrape(control_plane)
    ok = sum(
        v
        for (name, labels), v in m.items()
        if name == "aicluster_gateway_requests_total"
        and ("service", "metered") in labels
        and ("code", "200") in labels
    )
    assert ok == 3
    ttfb = sum(
        v
        for (name, labels), v in m.items()
        if name == "aicluster_gateway_time_to_first_byte_seconds_count"
        and ("service", "metered") in labels
    )
    assert ttfb == 3
    assert (
        value(m, "aicluster_gateway_request_seconds_count", team="default", service="metered") == 3
    )
    httpx.delete(control_plane.url + "/v1/services/metered", headers=headers)


def test_metrics_agree_with_the_api(control_plane, admin):
    job = admin.submit(
        {
            "kind": "job",
            "name": "holder",
            "workers": 2,
            "resources": {"gpus": 1, "cpus": 1},
            "command": "sleep 600",
        },
        None,
    )
    admin.wait(job["id"], {"RUNNING"}, timeout=60)
    try:
        m = scrape(control_plane)
        nodes = [n for n in admin.nodes() if n["alive"]]
        for pool in {n["pool"] for n in nodes}:
            mine = [n for n in nodes if n["pool"] == pool]
            assert value(m, "aicluster_gpus", pool=pool, kind="total") == sum(
                n["gpus"] for n in mine
            )
            assert value(m, "aicluster_gpus", pool=pool, kind="allocated") == sum(
                n["allocated"]["gpus"] for n in mine
            )
            for state in {n["state"] for n in mine}:
                count = sum(1 for n in mine if n["state"] == state)
                assert value(m, "aicluster_nodes", pool=pool, state=state) == count
        assert value(m, "aicluster_team_gpus_allocated", team="default") >= 2
        running = len(admin.jobs(status=["RUNNING"]))
        assert (
            sum(
                v
                for (name, labels), v in m.items()
                if name == "aicluster_jobs" and ("status", "RUNNING") in labels
            )
            == running
        )
    finally:
        admin.cancel(job["id"])
