"""`aicluster doctor`'s verdicts (core.doctor) over figures recorded from the probe.

RECORDED is what `python -m torch.distributed.run --nproc-per-node 3 -m
aicluster.runtime.doctor_probe --p2p-bytes 1048576 --allreduce-bytes 65536
--mem-bytes 16777216 --inject-delay rank-2:20` printed on the 2-core development machine
(outside a job: each rank's node is `rank-N`; values rounded to 4 digits, the sweep left
out): rank-2's links carry 20 ms of injected latency per message.
"""

from __future__ import annotations

import json

import pytest

from aicluster.core import doctor as dr

RECORDED = """\
aicluster: some other log line
DOCTOR {"check": "p2p_bw", "node": "rank-0", "peer": "rank-1", "value": 3.489, "unit": "GB/s", "bytes": 1048576, "round_trip_us": 601.0}
DOCTOR {"check": "p2p_bw", "node": "rank-0", "peer": "rank-2", "value": 0.09987, "unit": "GB/s", "bytes": 1048576, "round_trip_us": 21000.0}
DOCTOR {"check": "p2p_bw", "node": "rank-1", "peer": "rank-2", "value": 0.1006, "unit": "GB/s", "bytes": 1048576, "round_trip_us": 20850.0}
DOCTOR {"check": "allreduce_busbw", "value": 0.03718, "unit": "GB/s", "nodes": 2, "bytes": 65536}
DOCTOR {"check": "allreduce_latency", "value": 599.3, "unit": "us", "nodes": 2, "bytes": 1024}
DOCTOR {"check": "allreduce_busbw", "value": 0.003754, "unit": "GB/s", "nodes": 3, "bytes": 65536}
DOCTOR {"check": "allreduce_latency", "value": 21830.0, "unit": "us", "nodes": 3, "bytes": 1024}
DOCTOR {"check": "cpu_mem_bw", "node": "rank-0", "value": 28.13}
DOCTOR {"check": "cpu_matmul", "node": "rank-0", "value": 100.0, "n": 256}
DOCTOR {"check": "cpu_mem_bw", "node": "rank-1", "value": 27.33}
DOCTOR {"check": "cpu_matmul", "node": "rank-1", "value": 74.91, "n": 256}
DOCTOR {"check": "cpu_mem_bw", "node": "rank-2", "value": 24.44}
DOCTOR {"check": "cpu_matmul", "node": "rank-2", "value": 82.08, "n": 256}
DOCTOR {"check": "gpu_matmul", "node": "rank-0", "value": null, "status": "not_applicable", "detail": "CUDA is not available on this node (torch.cuda.is_available() is False)"}
DOCTOR {"check": "gpu_nvml", "node": "rank-0", "value": null, "status": "not_applicable", "detail": "NVML unavailable: NVML Shared Library Not Found"}
"""
NODES = ["rank-0", "rank-1", "rank-2"]


def by(report: dr.Report, check: str, node=None, peer=None) -> dr.Verdict:
    return next(
        v for v in report.verdicts if v.check == check and v.node == node and v.peer == peer
    )


def test_the_slowed_node_is_the_one_flagged_and_the_others_pass():
    report = dr.judge(dr.parse_lines(RECORDED), nodes=NODES)
    assert report.failing_nodes == ("rank-2",)
    assert report.slow_links == ()  # its slowness is its own, not one link's
    assert by(report, "p2p_node", "rank-2").verdict == dr.FAIL
    assert by(report, "p2p_node", "rank-0").verdict == dr.OK
    assert by(report, "p2p_bw", "rank-0", "rank-2").verdict == dr.FAIL
    assert by(report, "p2p_bw", "rank-0", "rank-1").verdict == dr.OK
    assert {by(report, c, n).verdict for c in ("cpu_mem_bw", "cpu_matmul") for n in NODES} == {
        dr.OK
    }
    assert report.verdict == dr.FAIL


def test_every_measurement_gets_one_verdict_and_absent_hardware_is_never_ok():
    found = dr.parse_lines(RECORDED)
    report = dr.judge(found, nodes=NODES)
    assert len(report.verdicts) == len(found) + 3  # + a p2p_node verdict per node
    for check in ("gpu_matmul", "gpu_nvml"):
        v = by(report, check, "rank-0")
        assert v.verdict == dr.NA and v.value is None and "not" in v.reason.lower()
    # a cluster-wide figure with nothing to compare with is reported, not judged
    busbw = [v for v in report.verdicts if v.check == "allreduce_busbw"]
    assert [v.nodes for v in busbw] == [2, 3] and {v.verdict for v in busbw} == {dr.UNJUDGED}


def test_a_slow_link_between_healthy_nodes_names_the_link_not_a_node():
    fast = {"check": "p2p_bw", "unit": "GB/s", "value": 3.0}
    lines = [
        {**fast, "node": "a", "peer": "b"},
        {**fast, "node": "a", "peer": "c", "value": 0.2},  # only a-c is slow
        {**fast, "node": "a", "peer": "d"},
        {**fast, "node": "b", "peer": "c"},
        {**fast, "node": "b", "peer": "d"},
        {**fast, "node": "c", "peer": "d"},
    ]
    found = [dr.Measurement.from_dict(d) for d in lines]
    report = dr.judge(found, nodes=["a", "b", "c", "d"])
    assert report.slow_links == (("a", "c"),)
    assert report.failing_nodes == ()


def test_two_nodes_cannot_tell_a_slow_link_from_a_slow_node():
    found = [dr.Measurement("p2p_bw", 0.01, "GB/s", "a", "b")]
    report = dr.judge(found, nodes=["a", "b"])
    assert {v.verdict for v in report.verdicts} == {dr.UNJUDGED}
    assert report.failing_nodes == ()


@pytest.mark.parametrize(
    ("value", "verdict"), [(170.0, dr.OK), (160.0, dr.OK), (140.0, dr.WARN), (100.0, dr.FAIL)]
)
def test_against_the_plan_ok_warn_and_fail(value, verdict):
    # infiniband-hdr (200 Gbit/s, one port 25 GB/s) would expect 20; a planned figure of 160
    # stands for a whole node's rails here: the band is what is tested
    exp = dr.Expectation("allreduce_busbw", 160.0, "plan")
    report = dr.judge(
        [dr.Measurement("allreduce_busbw", value, "GB/s", nodes=2)], {"allreduce_busbw": exp}
    )
    v = report.verdicts[0]
    assert v.verdict == verdict and v.expected == 160.0 and "expected 160" in v.reason


def test_latency_is_better_lower_and_the_worse_of_plan_and_peers_wins():
    exp = {"allreduce_latency": dr.Expectation("allreduce_latency", 50.0, "plan", higher=False)}
    fast = dr.judge([dr.Measurement("allreduce_latency", 40.0, "us", nodes=2)], exp)
    slow = dr.judge([dr.Measurement("allreduce_latency", 90.0, "us", nodes=2)], exp)
    assert fast.verdicts[0].verdict == dr.OK and slow.verdicts[0].verdict == dr.FAIL
    # cpu_mem_bw above the plan's figure on every node, but one node at a third of the others
    plan = {"cpu_mem_bw": dr.Expectation("cpu_mem_bw", 1.0, "plan")}
    found = [dr.Measurement("cpu_mem_bw", v, "GB/s", n) for n, v in zip("abc", (30, 29, 9))]
    report = dr.judge(found, plan, nodes=list("abc"))
    assert [v.verdict for v in report.verdicts] == [dr.OK, dr.OK, dr.FAIL]
    assert report.failing_nodes == ("c",)


def test_health_checks_keep_the_node_s_own_judgement_and_bad_lines_are_refused():
    lines = [
        {"check": "gpu_ecc", "node": "a", "value": 2, "status": "fail", "detail": "2 uncorrected"},
        {"check": "gpu_nvml", "node": "b", "value": None, "status": "ok", "detail": "8 healthy"},
    ]
    report = dr.judge([dr.Measurement.from_dict(d) for d in lines], nodes=["a", "b"])
    assert [v.verdict for v in report.verdicts] == [dr.FAIL, dr.OK]
    assert report.failing_nodes == ("a",)
    with pytest.raises(ValueError, match="not a doctor measurement"):
        dr.parse_lines('DOCTOR {"check": "made_up", "value": 1}')
    with pytest.raises(ValueError, match="must be a number"):
        dr.parse_lines('DOCTOR {"check": "cpu_matmul", "value": "fast"}')
    assert json.loads(json.dumps(report.to_dict()))["failing_nodes"] == ["a"]


def test_reports_are_kept_newest_first_paged_and_found_by_node(tmp_path):
    from aicluster.store.cursors import decode
    from aicluster.store.db import open_store
    from aicluster.store.doctor import DoctorReports

    store = open_store(tmp_path / "state.db")
    reports = DoctorReports(store)
    full = dr.judge(dr.parse_lines(RECORDED), nodes=NODES).to_dict()
    first = reports.add("doctor-1", "admin", full)
    other = dict(full, nodes=["n_%"], failing_nodes=[], verdict="ok")
    second = reports.add("doctor-2", "admin", other)
    assert second["id"] > first["id"] and first["report"] == json.loads(json.dumps(full))
    page, cursor = reports.page(1)
    assert [r["job_id"] for r in page] == ["doctor-2"]
    (before,) = decode(cursor, "doctor", int)
    rest, end = reports.page(1, before)
    assert [r["job_id"] for r in rest] == ["doctor-1"] and end is None
    assert [r["job_id"] for r in reports.page(10, node="rank-2")[0]] == ["doctor-1"]
    assert reports.page(10, node="n_")[0] == []  # LIKE wildcards are matched literally
    assert rest[0]["failing_nodes"] == ["rank-2"] and rest[0]["verdict"] == "fail"


def test_the_html_report_escapes_what_it_shows():
    from aicluster.cli.doctor_cmds import html_report

    report = dr.judge(dr.parse_lines(RECORDED), nodes=NODES).to_dict()
    page = html_report(report, {"rank-2": "<b>node</b>"})
    assert "&lt;b&gt;node&lt;/b&gt;" in page and "<b>node</b>" not in page
    assert page.count("<tr class=") == len(report["checks"])


def _node(name, pool="doctor", cpus=4.0, gpus=0, model=None, state="Ready"):
    return {
        "node_id": name + "0" * 8,
        "name": name,
        "pool": pool,
        "cpus": cpus,
        "gpus": gpus,
        "gpu_model": model,
        "state": state,
        "alive": state != "Down",
        "is_head": False,
    }


def test_doctor_takes_whole_nodes_of_one_shape_and_names_the_option_when_it_cannot():
    import typer

    from aicluster.cli.doctor_cmds import choose_nodes, job_spec

    rows = [_node("a"), _node("b"), _node("c", gpus=8, model="H100"), _node("d", state="Down")]
    chosen = choose_nodes(rows, ["a", "b0000"])
    spec = job_spec("doctor-x", chosen, ["--p2p-bytes=1024"])
    assert spec["workers"] == 2 and spec["resources"] == {"cpus": 4.0}
    assert spec["command"][:3] == ["python", "-m", "aicluster.runtime.doctor_probe"]
    gpu = job_spec("doctor-y", [_node("g", gpus=8, model="H100")], [])
    assert gpu["resources"] == {"cpus": 4.0, "gpus": 8, "gpu_model": "H100"}
    for wanted in (["zz"], ["d"], None):  # unknown, down, and mixed shapes without --nodes
        with pytest.raises(typer.Exit) as exit_:
            choose_nodes(rows, wanted)
        assert exit_.value.exit_code == 2


def test_expectations_come_from_the_plan_s_catalog_entries():
    from pathlib import Path

    from aicluster.cli.doctor_cmds import MATMUL_EFFICIENCY, expectations
    from aicluster.planner.catalog import load_catalog

    plan = Path(__file__).resolve().parents[2] / "examples" / "plan-serve-8b-70b.yaml"
    found = expectations(plan)
    catalog = load_catalog()
    net = catalog.get("interconnects", "ethernet-100g")
    h100 = catalog.get("gpus", "h100-sxm")
    assert found["p2p_bw"].value == pytest.approx(net.gbit_s / 8 * 0.8)
    assert found["gpu_matmul"].value == pytest.approx(h100.bf16_tflops * MATMUL_EFFICIENCY)
    assert found["gpu_mem_bw"].value == pytest.approx(h100.memory_bandwidth_gb_s * 0.8)
    assert "h100-sxm" in found["gpu_mem_bw"].source and set(found) <= set(dr.CHECKS)
