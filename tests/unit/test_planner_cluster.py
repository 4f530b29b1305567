"""Cluster, power, cost, pitfalls, --cluster inventory fit, reports and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from aicluster.cli import plan_cmds
from aicluster.planner import report as plan_report
from aicluster.planner.assumptions import BTU_PER_HOUR_PER_WATT, Assumptions
from aicluster.planner.catalog import load_catalog
from aicluster.planner.cluster import fabric, pack_nodes, serve_nodes
from aicluster.planner.inputs import resolve
from aicluster.planner.inventory import fit_inventory
from aicluster.planner.plan import make_plan, plan_to_dict
from aicluster.planner.power_cost import nodes_per_rack
from aicluster.planner.spec import load_plan_spec, load_plan_spec_text

ROOT = Path(__file__).parents[2]


def make_app() -> typer.Typer:
    """The plan command alone, as `register` adds it to the real CLI."""
    app = typer.Typer()
    plan_cmds.register(app)

    @app.command("version")
    def _version() -> None:  # a second command keeps typer from flattening `plan`
        pass

    return app


app = make_app()
CAT = load_catalog()


def plan_dict(text: str) -> dict:
    return plan_to_dict(make_plan(resolve(load_plan_spec_text(text), CAT)))


def test_node_packing_and_fabric():
    assert serve_nodes(5, 1, 8) == 1 and serve_nodes(5, 4, 8) == 3 and serve_nodes(2, 16, 8) == 4
    assert pack_nodes([4, 4, 2, 2, 2, 1], 8) == 2
    ib = CAT.get("interconnects", "infiniband-ndr")  # QM9700: 64 ports
    assert fabric(ib, 0).switches == 0
    assert fabric(ib, 64).switches == 1
    big = fabric(ib, 256)  # 32 down-ports per leaf -> 8 leaves, 4 spines
    assert (big.leaves, big.spines) == (8, 4)


def test_power_cost_and_cooling():
    d = plan_dict("""\
kind: plan
name: p
hardware: {node: dgx-h100, network: infiniband-ndr}
train:
  - {name: t, model: llama-3-8b, tokens: 1e10, gpus: 32}
constraints: {pue: 1.5, electricity_usd_per_kwh: 0.1, rack_power_kw: 40, amortization_months: 36}
""")
    t = d["totals"]
    assert t["nodes"] == 4 and t["switches"] == 1
    assert t["it_kw"] == pytest.approx(4 * 10.2 + 1.5)
    assert t["facility_kw"] == pytest.approx(t["it_kw"] * 1.5)
    assert t["cooling_btu_per_hour"] == pytest.approx(t["it_kw"] * 1000 * BTU_PER_HOUR_PER_WATT)
    assert t["capex_usd"] == 4 * (8 * 30000 + 60000) + 50000
    assert t["energy_usd_per_month"] == pytest.approx(t["facility_kw"] * 730 * 0.1)
    # per 40 kW rack: min(40 // 10.2 = 3 by power, 42U // 8U = 5 by space) = 3 -> 2 racks
    assert t["racks"] == 2


def test_rack_power_pitfall_and_budget():
    d = plan_dict("""\
kind: plan
name: p
serve: [{name: s, model: llama-3-8b}]
constraints: {rack_power_kw: 8, budget_usd: 1000}
""")
    codes = {(p["code"], p["severity"]) for p in d["pitfalls"]}
    assert ("power", "error") in codes and ("budget", "error") in codes
    assert ("single_point_of_failure", "warning") in codes
    assert nodes_per_rack(CAT.get("nodes", "dgx-h100"), 8) == 0


def test_slow_network_and_storage_pitfalls():
    d = plan_dict("""\
kind: plan
name: p
hardware: {node: dgx-h100, network: ethernet-10g, nics_per_node: 1, shared_storage: nfs-10gbe}
train:
  - {name: t, model: llama-2-7b, tokens: 1e11, gpus: 64}
serve:
  - {name: s, model: llama-3-70b, requests_per_second: 200}
""")
    codes = {(p["code"], p["workload"]) for p in d["pitfalls"]}
    assert ("slow_network", "t") in codes
    assert ("storage_bottleneck", "s") in codes or ("storage_bottleneck", "t") in codes
    assert d["train"][0]["network_bound"]


def test_cluster_mode_places_replicas_on_real_inventory():
    inputs = resolve(load_plan_spec(ROOT / "examples/plan-serve-8b-70b.yaml"), CAT)
    nodes = [
        {
            "node_id": "a",
            "name": "gpu-a",
            "alive": True,
            "gpus": 8,
            "gpu_model": "NVIDIA H100 80GB HBM3",
            "allocated": {"gpus": 2},
            "pool": "serve",
        },
        {
            "node_id": "b",
            "name": "gpu-b",
            "alive": True,
            "gpus": 8,
            "gpu_model": "H100",
            "allocated": {"gpus": 0},
        },
        {"node_id": "c", "name": "cpu-c", "alive": True, "gpus": 0, "gpu_model": None},
        {"node_id": "d", "name": "gpu-d", "alive": False, "gpus": 8, "gpu_model": "H100"},
        {"node_id": "e", "name": "gpu-e", "alive": True, "gpus": 4, "gpu_model": "Tesla T4"},
    ]
    fit = fit_inventory(inputs, nodes, inputs.catalog)
    assert fit["nodes"] == 2 and fit["free_gpus"] == 14
    chat, big = fit["serve"]
    assert chat["fits"] and sum(p["gpus"] for p in chat["placement"]) == chat["replicas_needed"]
    assert not big["fits"] and "replicas fit" in big["reason"]
    assert any("T4" in n for n in fit["notes"]) and any("not alive" in n for n in fit["notes"])


def test_reports_have_tables_and_svg_charts():
    d = plan_to_dict(
        make_plan(resolve(load_plan_spec(ROOT / "examples/plan-serve-8b-70b.yaml"), CAT))
    )
    md = plan_report.markdown(d)
    assert "| workload |" in md and "<svg" in md and "## Pitfalls" in md
    page = plan_report.html_report(d)
    assert page.startswith("<!doctype html>") and page.count("<svg") >= 4
    assert "Memory per GPU" in page and "capacity against replicas" in page
    json.dumps(d)  # JSON-serialisable


def test_cli_plan_outputs(tmp_path):
    runner = CliRunner()
    ex = str(ROOT / "examples/plan-pretrain-1b.yaml")
    res = runner.invoke(app, ["plan", ex])
    assert res.exit_code == 0, res.output
    assert "Training" in res.output and "pretrain-1b" in res.output
    res = runner.invoke(app, ["plan", ex, "-o", "json"])
    assert res.exit_code == 0
    assert json.loads(res.stdout)["train"][0]["gpus"] == 24
    report = tmp_path / "r.html"
    res = runner.invoke(app, ["plan", ex, "--report", str(report)])
    assert res.exit_code == 0 and "<svg" in report.read_text()


def test_cli_bad_spec_exits_2_with_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: plan\nname: p\nserve:\n  - name: s\n    model: nope\n")
    res = CliRunner().invoke(app, ["plan", str(bad)])
    assert res.exit_code == 2
    assert "line 5: serve.0.model: unknown model 'nope'" in res.output


def test_assumptions_defaults_are_documented():
    for name in Assumptions().as_dict():
        assert Assumptions.__dataclass_fields__[name]  # every knob is a constraints field too
