"""`aicluster plan --calibrate doctor.json`: measured figures in place of datasheet ones.

The doctor reports are built as `aicluster doctor` builds them: probe lines (`DOCTOR {...}`,
figures of the size the probe prints on a 4-node DGX H100 cluster on InfiniBand NDR, and the
development machine's recorded lines of tests/unit/test_doctor_verdicts.py for a slow node)
judged by core.doctor into the report `-o json` prints.
"""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from aicluster.cli import doctor_cmds, plan_cmds
from aicluster.core import doctor as dr
from aicluster.planner import assumptions
from aicluster.planner.calibrate import CalibrationError, calibrate
from aicluster.planner.catalog import load_catalog
from aicluster.planner.inference import decode_step_s
from aicluster.planner.inputs import resolve
from aicluster.planner.plan import make_plan, plan_to_dict
from aicluster.planner.spec import load_plan_spec_text

NODES = ["n0", "n1", "n2", "n3"]
HW = "hardware:\n  node: dgx-h100\n  network: infiniband-ndr\n  shared_storage: nfs-100gbe\n"
# communication-heavy: one NIC per node and 1024 tokens per GPU per step
TRAIN = (
    "kind: plan\nname: p\n"
    + HW
    + "  nics_per_node: 1\ntrain:\n  - name: t\n    model: llama-3.1-8b\n"
    "    tokens: 10B\n    gpus: 32\n    global_batch_tokens: 32K\n    sequence_length: 1024\n"
)
SERVE = (
    "kind: plan\nname: s\n" + HW + "serve:\n  - name: chat\n    model: llama-3.1-8b\n"
    "    prompt_tokens: 1000\n    output_tokens: 200\n    requests_per_second: 5\n"
    "    tensor_parallel: 1\n"
)


def line(**fields) -> str:
    return "DOCTOR " + json.dumps(fields)


def probe_lines(
    busbw: float = 30.0,
    mem_bw: tuple = (2600.0, 2650.0, 2700.0, 2550.0),
    matmul: tuple = (500.0, 510.0, 495.0, 505.0),
    read: float = 1.0,
    write: float = 0.5,
) -> str:
    out = [line(check="allreduce_busbw", value=busbw * 1.1, unit="GB/s", nodes=2, bytes=16 << 20)]
    out.append(line(check="allreduce_busbw", value=busbw, unit="GB/s", nodes=4, bytes=16 << 20))
    out.append(line(check="allreduce_latency", value=35.0, unit="us", nodes=4, bytes=1024))
    for i, a in enumerate(NODES):
        for b in NODES[i + 1 :]:
            out.append(line(check="p2p_bw", node=a, peer=b, value=36.0, unit="GB/s"))
    for n, bw, tf in zip(NODES, mem_bw, matmul):
        out.append(line(check="cpu_mem_bw", node=n, value=60.0))
        out.append(line(check="gpu_matmul", node=n, value=tf, unit="TFLOPS", gpu=0))
        out.append(line(check="gpu_mem_bw", node=n, value=bw, unit="GB/s", gpu=0))
        out.append(line(check="gpu_nvml", node=n, value=None, status="ok", detail="8 healthy"))
        out.append(line(check="storage_write", node=n, value=write, unit="GB/s"))
        out.append(line(check="storage_read", node=n, value=read, unit="GB/s"))
    return "\n".join(out) + "\n"


def doctor_report(text: str | None = None, expect=None, nodes=NODES, **figures) -> dict:
    found = dr.parse_lines(text if text is not None else probe_lines(**figures))
    return json.loads(json.dumps(dr.judge(found, expect, nodes=nodes).to_dict()))


def inputs(text: str):
    return resolve(load_plan_spec_text(text), load_catalog())


def planned(text: str, report: dict | None = None) -> dict:
    inp = inputs(text)
    if report is not None:
        inp, _ = calibrate(inp, report)
    return plan_to_dict(make_plan(inp))


def by_use(cal) -> dict:
    return {i.uses: i for i in cal.items}


def test_every_measured_figure_becomes_measured_over_datasheet():
    inp, cal = calibrate(inputs(TRAIN), doctor_report())
    a = inp.assumptions
    # NDR: one port 400 Gb/s = 50 GB/s; the 4-node all-reduce (the largest) 30 GB/s
    assert a.network_efficiency == pytest.approx(30.0 / 50.0)
    # H100 SXM 3350 GB/s; median of 2550, 2600, 2650, 2700
    assert a.bandwidth_efficiency == pytest.approx(2625.0 / 3350.0)
    # 502.5 TFLOPS against the healthy floor 989.4 x 0.6
    scale = 502.5 / (989.4 * assumptions.MATMUL_EFFICIENCY)
    assert a.mfu_scale == pytest.approx(scale) and scale < 1
    assert a.prefill_efficiency == pytest.approx(0.5 * scale)
    # one node at a time gets 1.0 of its bound min(12.5 aggregate, one 50 GB/s NIC) = 12.5
    assert inp.storage.read_gb_s == pytest.approx(1.0)
    assert inp.storage.write_gb_s == pytest.approx(0.5)
    assert a.nvlink_efficiency == 0.8 and a.allreduce_latency_us == 22.0  # not measured
    items = by_use(cal)
    net = items["network_efficiency"]
    assert (net.figure, net.measured, net.datasheet, net.before, net.samples) == (
        "allreduce_busbw",
        30.0,
        50.0,
        0.8,
        1,
    )
    assert net.datasheet_source == "infiniband-ndr one port 50 GB/s"
    mem = items["bandwidth_efficiency"]
    assert (mem.samples, mem.low, mem.high, mem.datasheet) == (4, 2550.0, 2700.0, 3350.0)
    assert not any(i.clamped for i in cal.items)
    assert any("allreduce_latency" in n and "cpu_mem_bw" in n for n in cal.notes)


def test_halving_the_network_doubles_a_communication_bound_run():
    fast = planned(TRAIN, doctor_report(busbw=30.0))["train"][0]
    slow = planned(TRAIN, doctor_report(busbw=15.0))["train"][0]
    assert fast["layout"] == slow["layout"]
    assert slow["step_comm_s"] == pytest.approx(2 * fast["step_comm_s"])
    assert fast["network_bound"] and slow["seconds"] == pytest.approx(2 * fast["seconds"])
    # against the datasheet default (0.8 of the port): 30 GB/s is 0.6, so 4/3 the time
    plain = planned(TRAIN)["train"][0]
    assert fast["step_comm_s"] == pytest.approx(plain["step_comm_s"] * 0.8 / 0.6)


def test_a_slow_gpu_scales_mfu_and_a_slow_memory_the_decode_step():
    base = doctor_report()
    half = doctor_report(matmul=(250.0, 255.0, 247.5, 252.5))  # half of each
    assert planned(TRAIN, half)["train"][0]["mfu"] == pytest.approx(
        planned(TRAIN, base)["train"][0]["mfu"] / 2
    )
    full = planned(TRAIN, base)["train"][0]["compute_bound_seconds"]
    assert planned(TRAIN, half)["train"][0]["compute_bound_seconds"] == pytest.approx(2 * full)
    # a decode step at batch 1, TP 1 is weight reads (memory-bound) after its fixed cost
    slow_mem = doctor_report(mem_bw=(1300.0, 1325.0, 1350.0, 1275.0))
    steps = []
    for report in (base, slow_mem):
        inp, _ = calibrate(inputs(SERVE), report)
        fixed = inp.serve[0].model.layers * inp.assumptions.step_overhead_per_layer_us * 1e-6
        steps.append((decode_step_s(inp.serve[0], inp.assumptions, 1, 1), fixed))
    (fast, fixed), (slow, _) = steps
    assert slow - fixed == pytest.approx(2 * (fast - fixed))
    tpot = [planned(SERVE, r)["serve"][0]["chosen"]["tpot_batch1_s"] for r in (base, slow_mem)]
    assert tpot[1] > tpot[0]


def test_storage_figures_move_checkpoint_writes():
    fast = planned(TRAIN, doctor_report(write=1.0))["train"][0]["checkpoint_write_s"]
    slow = planned(TRAIN, doctor_report(write=0.25))["train"][0]["checkpoint_write_s"]
    assert slow == pytest.approx(4 * fast)


def test_a_figure_above_the_datasheet_is_clamped_and_said():
    inp, cal = calibrate(inputs(TRAIN), doctor_report(busbw=60.0, matmul=(700.0,) * 4))
    assert inp.assumptions.network_efficiency == 1.0
    items = by_use(cal)
    assert items["network_efficiency"].clamped and items["network_efficiency"].measured == 60.0
    assert "allreduce_busbw 60 GB/s is 120% of the datasheet (50 GB/s)" in " ".join(cal.notes)
    assert "network_efficiency clamped to 1, its value at 100%" in " ".join(cal.notes)
    # a GPU above the healthy floor keeps the table's MFU (and the prefill efficiency)
    assert inp.assumptions.mfu_scale == 1.0 and inp.assumptions.prefill_efficiency == 0.5
    assert items["mfu_scale"].clamped and "mfu_scale clamped to 1" in " ".join(cal.notes)
    # storage: a client faster than the aggregate keeps the aggregate
    inp, cal = calibrate(inputs(TRAIN), doctor_report(read=20.0))
    assert inp.storage.read_gb_s == 12.5 and by_use(cal)["storage.read_gb_s"].clamped


# the development machine's recorded lines (test_doctor_verdicts.RECORDED): rank-2's links
# carry 20 ms of injected latency; no CUDA
RECORDED = """\
DOCTOR {"check": "p2p_bw", "node": "rank-0", "peer": "rank-1", "value": 3.489, "unit": "GB/s"}
DOCTOR {"check": "p2p_bw", "node": "rank-0", "peer": "rank-2", "value": 0.09987, "unit": "GB/s"}
DOCTOR {"check": "p2p_bw", "node": "rank-1", "peer": "rank-2", "value": 0.1006, "unit": "GB/s"}
DOCTOR {"check": "allreduce_busbw", "value": 0.03718, "unit": "GB/s", "nodes": 2}
DOCTOR {"check": "allreduce_busbw", "value": 0.003754, "unit": "GB/s", "nodes": 3}
DOCTOR {"check": "cpu_mem_bw", "node": "rank-0", "value": 28.13}
DOCTOR {"check": "gpu_matmul", "node": "rank-0", "value": null, "status": "not_applicable"}
"""


def test_a_slow_node_and_not_applicable_figures_are_left_out_and_named():
    report = doctor_report(RECORDED, nodes=["rank-0", "rank-1", "rank-2"])
    assert report["failing_nodes"] == ["rank-2"]
    inp, cal = calibrate(inputs(TRAIN), report)
    net = by_use(cal)["network_efficiency"]
    # the all-reduces may include rank-2: the healthy pair stands in
    assert (net.figure, net.measured, net.samples) == ("p2p_bw", 3.489, 1)
    assert inp.assumptions.network_efficiency == pytest.approx(3.489 / 50.0)
    assert set(by_use(cal)) == {"network_efficiency"}  # no GPU figure was measured
    notes = " ".join(cal.notes)
    assert "not used: the figures of rank-2" in notes
    assert "allreduce_busbw not used" in notes
    assert "not measured (not_applicable, null or 0): gpu_matmul x1" in notes


def test_a_cluster_wholly_below_its_plan_is_calibrated_not_discarded(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text(TRAIN)
    expect = doctor_cmds.expectations(path)
    # the doctor side builds its floor with the constant the planner owns
    assert doctor_cmds.MATMUL_EFFICIENCY is assumptions.MATMUL_EFFICIENCY
    assert expect["gpu_matmul"].value == pytest.approx(989.4 * assumptions.MATMUL_EFFICIENCY)
    report = doctor_report(expect=expect, matmul=(300.0, 300.0, 300.0, 300.0))
    assert set(report["failing_nodes"]) == set(NODES)  # every node below the plan's floor
    inp, _ = calibrate(inputs(TRAIN), report)
    assert inp.assumptions.mfu_scale == pytest.approx(300.0 / 593.64)


def make_app() -> typer.Typer:
    app = typer.Typer()
    plan_cmds.register(app)
    app.command("version")(lambda: None)  # a second command keeps typer from flattening `plan`
    return app


def run(tmp_path, report: str | dict | None, *args: str):
    plan = tmp_path / "plan.yaml"
    plan.write_text(TRAIN)
    doc = tmp_path / "doctor.json"
    if report is not None:
        doc.write_text(report if isinstance(report, str) else json.dumps(report))
    res = CliRunner().invoke(make_app(), ["plan", str(plan), "--calibrate", str(doc), *args])
    return res, " ".join(res.output.split())


def test_the_reports_say_what_was_calibrated(tmp_path):
    res, _ = run(tmp_path, doctor_report(), "-o", "json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    cal = d["calibration"]
    assert cal["source"].endswith("doctor.json")
    net = next(i for i in cal["items"] if i["uses"] == "network_efficiency")
    assert (net["before"], net["after"], net["measured"], net["datasheet"]) == (0.8, 0.6, 30, 50)
    assert d["assumptions"]["network_efficiency"] == 0.6
    res, text = run(tmp_path, doctor_report())
    assert res.exit_code == 0, res.output
    assert "Calibration (from" in text
    assert "network_efficiency 0.8 0.6 allreduce_busbw 30 GB/s, median of 1" in text
    res, text = run(tmp_path, doctor_report(), "-o", "markdown")
    assert "## Calibration (from" in text
    assert (
        "| network_efficiency | 0.8 | 0.6 | allreduce_busbw 30 GB/s, median of 1 | 50 GB/s "
        "(infiniband-ndr one port 50 GB/s) |" in res.output
    )
    res, text = run(tmp_path, doctor_report(), "-o", "html")
    assert "<h2>Calibration (from" in text and "<td>network_efficiency</td>" in text


@pytest.mark.parametrize(
    ("report", "message"),
    [
        (None, "cannot read"),
        ("{not json", "not JSON (Expecting property name enclosed in double quotes at line 1)"),
        ("[1, 2]", "report: expected a JSON object (the output of `aicluster doctor -o json`)"),
        ({"verdict": "ok"}, "checks: missing or not a list"),
        (
            {"checks": [{"check": "gpu_matmul", "value": "fast"}]},
            "checks.0.value: must be a number or null, not 'fast'",
        ),  # fmt: skip
        ({"checks": [{"check": "made_up", "value": 1}]}, "checks.0.check: unknown check 'made_up'"),
        (
            {"checks": [{"check": "p2p_bw", "value": 1, "unit": "MB/s"}]},
            "checks.0.unit: p2p_bw is measured in GB/s, not 'MB/s'",
        ),  # fmt: skip
        (
            {"checks": [{"check": "cpu_matmul", "value": 80.0, "node": "a"}]},
            "checks: no usable figure: none of allreduce_busbw, p2p_bw",
        ),  # fmt: skip
    ],
)
def test_a_bad_report_exits_2_naming_the_field(tmp_path, report, message):
    res, text = run(tmp_path, report)
    assert res.exit_code == 2
    assert text.startswith("error: --calibrate: ") and message in text
    assert "Traceback" not in res.output


def test_calibration_error_names_the_field():
    with pytest.raises(CalibrationError) as err:
        calibrate(inputs(TRAIN), {"checks": [], "nodes": "n0"})
    assert err.value.field == "nodes"
