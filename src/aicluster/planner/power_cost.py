"""Power, cooling, racks and money.

- IT power = Σ nodes x node maximum power + switches x switch power (vendor maxima: a
  planning upper bound; sustained draw under training is typically close to it).
- Facility power = IT power x PUE (The Green Grid, "PUE: a comprehensive examination of
  the metric", White Paper #49, 2012).
- Cooling load in BTU/h = IT watts x 3.412142 (NIST SP 811 Appendix B.8).
- Racks: per rack, as many nodes as both the rack power budget and 42U allow.
- Capital cost = Σ node price (the shape's price, else GPUs x GPU price + base price)
  + switches x switch price. Monthly = facility kWh (730 h/month) x tariff
  + capital / amortisation months.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from aicluster.planner.assumptions import (
    BTU_PER_HOUR_PER_WATT,
    HOURS_PER_MONTH,
    Assumptions,
)
from aicluster.planner.cluster import Fabric, Pool
from aicluster.planner.hardware import Gpu, NodeShape

RACK_UNITS = 42


@dataclass(frozen=True)
class PowerCost:
    it_kw: float
    facility_kw: float
    btu_per_hour: float
    racks: int
    nodes_per_rack: dict[str, int]
    capex_usd: float
    node_capex_usd: float
    network_capex_usd: float
    energy_usd_per_month: float
    amortization_usd_per_month: float

    @property
    def monthly_usd(self) -> float:
        return self.energy_usd_per_month + self.amortization_usd_per_month


def node_price(node: NodeShape, gpu: Gpu) -> float:
    if node.price_usd is not None:
        return node.price_usd
    return node.gpus * (gpu.price_usd or 0.0) + node.base_price_usd


def nodes_per_rack(node: NodeShape, rack_power_kw: float) -> int:
    """0 when one node alone exceeds the rack's power budget."""
    by_power = int(rack_power_kw * 1000 // node.power_w)
    return min(by_power, RACK_UNITS // max(1, node.rack_units))


def power_and_cost(
    pools: list[Pool], gpus: dict[str, Gpu], fab: Fabric, a: Assumptions
) -> PowerCost:
    """`gpus` maps a node shape key to its GPU record."""
    node_w = sum(p.nodes * p.node.power_w for p in pools)
    switch_w = fab.switches * fab.network.switch_power_w
    it_w = node_w + switch_w
    facility_w = it_w * a.pue
    per_rack: dict[str, int] = {}
    racks = 0
    by_shape: dict[str, int] = {}
    for p in pools:
        by_shape[p.node.key] = by_shape.get(p.node.key, 0) + p.nodes
    shapes = {p.node.key: p.node for p in pools}
    for key, count in by_shape.items():
        fit = nodes_per_rack(shapes[key], a.rack_power_kw)
        per_rack[key] = fit
        racks += math.ceil(count / fit) if fit else count
    node_capex = sum(p.nodes * node_price(p.node, gpus[p.node.key]) for p in pools)
    net_capex = fab.switches * fab.network.switch_price_usd
    capex = node_capex + net_capex
    energy = facility_w / 1000 * HOURS_PER_MONTH * a.electricity_usd_per_kwh
    return PowerCost(
        it_kw=it_w / 1000,
        facility_kw=facility_w / 1000,
        btu_per_hour=it_w * BTU_PER_HOUR_PER_WATT,
        racks=racks,
        nodes_per_rack=per_rack,
        capex_usd=capex,
        node_capex_usd=node_capex,
        network_capex_usd=net_capex,
        energy_usd_per_month=energy,
        amortization_usd_per_month=capex / a.amortization_months,
    )


def run_energy_usd(node: NodeShape, nodes: int, seconds: float, a: Assumptions) -> float:
    """Electricity for a training run: nodes x power x PUE x hours x tariff."""
    return nodes * node.power_w / 1000 * a.pue * seconds / 3600 * a.electricity_usd_per_kwh
