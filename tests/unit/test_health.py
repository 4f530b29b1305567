"""Health judgement over recorded readings (NVML-like) and node state rules."""

from __future__ import annotations

import pytest

from aicluster.core.health import (
    FAIL,
    NA,
    OK,
    CommandOutcome,
    GpuReading,
    GpuSample,
    HostSample,
    Thresholds,
    check_gpus,
    evaluate,
)
from aicluster.core.nodestate import NODE_TRANSITIONS, NodeState, check_node_transition, next_state

GB = 10**9
CALM = HostSample(
    cpus=8, load_1m=1.0, memory_used_pct=40.0, disk_free_bytes=50 * GB, disk_total_bytes=100 * GB
)
# Readings as NVML reports them on an 8-GPU H100 node (temperatures in C, utilisation in %).
H100_OK = tuple(GpuReading(i, "NVIDIA H100 80GB HBM3", 41.0 + i, 0.0) for i in range(8))


def statuses(results):
    return {r.name: r.status for r in results}


def test_healthy_gpu_node():
    report = evaluate(CALM, GpuSample(True, H100_OK), 8, [])
    assert report.healthy and report.reason == ""
    assert statuses(report.checks)["gpu_count"] == OK


def test_no_nvml_is_not_applicable_never_ok():
    results = check_gpus(4, GpuSample(False, error="NVML unavailable: library not found"))
    assert [r.status for r in results] == [NA]
    assert "4 GPU(s)" in results[0].message
    report = evaluate(CALM, GpuSample(False, error="x"), 0, [])
    assert report.healthy and OK not in [c.status for c in report.checks if c.name == "gpu"]


@pytest.mark.parametrize(
    "reading, words",
    [
        (GpuReading(3, ecc_uncorrected=2), "uncorrected ECC"),
        (GpuReading(3, xid_events=(79,)), "XID 79"),
        (GpuReading(3, temperature_c=95.0), "95 C"),
        (GpuReading(3, utilization_pct=100.0, processes=0), "stuck"),
    ],
)
def test_gpu_faults_fail_the_node(reading, words):
    devices = H100_OK[:3] + (reading,) + H100_OK[4:]
    report = evaluate(CALM, GpuSample(True, devices), 8, [])
    assert not report.healthy
    assert "gpu3" in report.reason and words in report.reason


def test_busy_gpu_with_a_process_is_fine():
    busy = GpuReading(0, utilization_pct=100.0, processes=1)
    assert evaluate(CALM, GpuSample(True, (busy,)), 1, []).healthy


def test_missing_gpu_fails_the_count():
    report = evaluate(CALM, GpuSample(True, H100_OK[:7]), 8, [])
    assert statuses(report.checks)["gpu_count"] == FAIL
    assert "7 visible, 8 declared" in report.reason


def test_host_pressure_and_admin_commands():
    full = HostSample(
        cpus=2, load_1m=30.0, memory_used_pct=99.0, disk_free_bytes=GB, disk_total_bytes=100 * GB
    )
    report = evaluate(full, GpuSample(False), 0, [], Thresholds())
    assert {"memory", "disk", "cpu"} <= {c.name for c in report.checks if c.status == FAIL}
    cmds = [
        CommandOutcome("ib", 1, "port down"),
        CommandOutcome("nfs", None, ""),
        CommandOutcome("ok", 0),
    ]
    report = evaluate(CALM, GpuSample(False), 0, cmds)
    s = statuses(report.checks)
    assert s["cmd:ib"] == FAIL and s["cmd:nfs"] == FAIL and s["cmd:ok"] == OK
    assert "port down" in report.reason and "timed out" in report.reason


@pytest.mark.parametrize(
    "free, total, status",
    [
        (4.8 * GB, 252 * GB, OK),  # a large shared volume at 1.9%: gigabytes to spare
        (1 * GB, 252 * GB, FAIL),  # under 3% and under 2 GiB
        (1 * GB, 20 * GB, OK),  # a small disk at 5%
        (0.5 * GB, 20 * GB, FAIL),  # ... at 2.5% and half a gigabyte
        (100 * GB, 10_000 * GB, OK),  # 1% of 10 TB
    ],
)
def test_a_disk_is_full_when_short_on_both_percent_and_bytes(free, total, status):
    sample = HostSample(
        cpus=8, load_1m=1.0, memory_used_pct=40.0, disk_free_bytes=int(free), disk_total_bytes=total
    )
    report = evaluate(sample, GpuSample(False), 0, [])
    disk = next(c for c in report.checks if c.name == "disk")
    assert disk.status == status
    assert f"{free / (1 << 30):.1f} GiB free" in disk.message


def test_node_state_rules():
    R, D, C, Dr, Dn = (
        NodeState.READY,
        NodeState.DEGRADED,
        NodeState.CORDONED,
        NodeState.DRAINING,
        NodeState.DOWN,
    )
    assert next_state(R, alive=True, healthy=False) == D
    assert next_state(D, alive=True, healthy=True) == R
    assert next_state(C, alive=True, healthy=True) == C, "an admin's cordon sticks"
    assert next_state(Dr, alive=True, healthy=False) == Dr
    assert next_state(C, alive=False, healthy=True) == Dn
    assert next_state(Dn, alive=True, healthy=True) == R
    assert [s for s in NodeState if s.schedulable] == [R]
    for src in NodeState:
        for dst in NodeState:
            if dst in NODE_TRANSITIONS[src]:
                check_node_transition(src, dst)
            else:
                with pytest.raises(ValueError):
                    check_node_transition(src, dst)
        assert next_state(src, True, True) in NODE_TRANSITIONS[src] | {src}
        assert next_state(src, True, False) in NODE_TRANSITIONS[src] | {src}
        assert next_state(src, False, True) in NODE_TRANSITIONS[src] | {src}
