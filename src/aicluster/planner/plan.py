"""One plan from resolved inputs: every workload sized, the cluster built, pitfalls named.

`make_plan(inputs)` is pure; `plan_to_dict(plan)` gives the JSON the CLI prints with
`-o json` and the reports read. Every number in it is in SI units named by its key
(`_bytes`, `_s`, `_kw`, `_usd`).
"""

from __future__ import annotations

from dataclasses import dataclass

from aicluster.planner.checks import batch_finding
from aicluster.planner.cluster import (
    Fabric,
    Pool,
    fabric,
    pack_nodes,
    serve_nodes,
    topology,
)
from aicluster.planner.hardware import Gpu, NodeShape
from aicluster.planner.inference import ServePlan, plan_serving, throughput_curve
from aicluster.planner.inputs import PlanInputs
from aicluster.planner.memory import param_counts
from aicluster.planner.pitfalls import (
    Pitfall,
    checkpoint_pitfall,
    network_pitfall,
    storage_pitfalls,
)
from aicluster.planner.power_cost import (
    PowerCost,
    nodes_per_rack,
    power_and_cost,
    run_energy_usd,
)
from aicluster.planner.storage import Distribution, checkpoint_write_s, distribute
from aicluster.planner.training import TrainPlan, plan_training, time_vs_nodes


@dataclass(frozen=True)
class ServeResult:
    plan: ServePlan
    node: NodeShape
    nodes: int
    distribution: Distribution | None


@dataclass(frozen=True)
class TrainResult:
    plan: TrainPlan
    node: NodeShape
    checkpoint_write_s: float
    energy_usd: float
    time_vs_nodes: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class Plan:
    inputs: PlanInputs
    serve: tuple[ServeResult, ...]
    train: tuple[TrainResult, ...]
    pools: tuple[Pool, ...]
    fabric: Fabric
    topology: str
    power_cost: PowerCost
    pitfalls: tuple[Pitfall, ...]
    warnings: tuple[tuple[str, str], ...] = ()  # (spec field, message): implausible inputs


def _serve(inputs: PlanInputs) -> list[ServeResult]:
    out = []
    for req in inputs.serve:
        node = inputs.node_of[req.name]
        sp = plan_serving(req, inputs.assumptions)
        nodes = 0
        dist = None
        if sp.chosen:
            nodes = serve_nodes(sp.chosen.replicas, sp.chosen.gpus_per_replica, node.gpus)
            dist = distribute(
                sp.weight_bytes,
                nodes,
                inputs.storage.read_gb_s,
                inputs.node_network_gb_s(node),
                node.nvme_read_gb_s,
            )
        out.append(ServeResult(sp, node, nodes, dist))
    return out


def _train(inputs: PlanInputs) -> list[TrainResult]:
    out = []
    for req in inputs.train:
        node = inputs.node_of[req.name]
        tp = plan_training(req, inputs.assumptions)
        write_s = checkpoint_write_s(tp.checkpoint_bytes, inputs.storage.write_gb_s)
        curve = time_vs_nodes(req, inputs.assumptions, max(4, 2 * tp.nodes))
        energy = run_energy_usd(node, tp.nodes, tp.seconds, inputs.assumptions) if tp.fits else 0.0
        out.append(TrainResult(tp, node, write_s, energy, tuple(curve)))
    return out


def _pools(serve: list[ServeResult], train: list[TrainResult]) -> list[Pool]:
    """Serving workloads on one node shape share a pool (replicas packed onto its nodes);
    each training run gets whole nodes."""
    groups: dict[tuple[str, str], list] = {}
    replicas: dict[str, list[int]] = {}
    for s in serve:
        c = s.plan.chosen
        used = c.total_gpus if c else 0
        groups.setdefault(("serve", s.node.key), []).append(
            (s.plan.request.name, s.node, s.nodes, used)
        )
        if c:
            replicas.setdefault(s.node.key, []).extend([c.gpus_per_replica] * c.replicas)
    for t in train:
        groups.setdefault(("train", t.node.key), []).append(
            (t.plan.request.name, t.node, t.plan.nodes, t.plan.gpus)
        )
    pools = []
    for (role, key), items in groups.items():
        node = items[0][1]
        if role == "serve":
            count = pack_nodes(replicas.get(key, []), node.gpus)
        else:
            count = sum(i[2] for i in items)
        pools.append(
            Pool(
                name=f"{key}-{role}",
                role=role,
                node=node,
                nodes=count,
                gpus_used=sum(i[3] for i in items),
                workloads=tuple(i[0] for i in items),
            )
        )
    return pools


def make_plan(inputs: PlanInputs) -> Plan:
    a = inputs.assumptions
    serve, train = _serve(inputs), _train(inputs)
    pools = _pools(serve, train)
    ports = sum(p.nodes * (inputs.nics_per_node or p.node.nics) for p in pools)
    total_nodes = sum(p.nodes for p in pools)
    fab = fabric(inputs.network, ports if total_nodes > 1 else 0)
    gpus: dict[str, Gpu] = {}
    for r in (*inputs.serve, *inputs.train):
        gpus[inputs.node_of[r.name].key] = r.gpu
    pc = power_and_cost(pools, gpus, fab, a)
    pitfalls = _pitfalls(inputs, serve, train, pools, fab, pc, total_nodes)
    return Plan(
        inputs,
        tuple(serve),
        tuple(train),
        tuple(pools),
        fab,
        topology(pools),
        pc,
        tuple(pitfalls),
        inputs.warnings + tuple(_batch_warnings(inputs, train)),
    )


def _batch_warnings(inputs: PlanInputs, train: list[TrainResult]) -> list[tuple[str, str]]:
    """Global batches with fewer sequences than the chosen layout has data-parallel ranks.
    (`resolve` refuses a plan with any bad workload, so `train[i]` is the spec's `train.i`.)"""
    out = []
    for i, t in enumerate(train):
        r, lay = t.plan.request, t.plan.layout
        if lay is None:
            continue
        found = batch_finding(
            f"train.{i}", r.global_batch_tokens, r.sequence_length, r.micro_batch, lay.dp, lay.gpus
        )
        if found:
            out.append(found)
    return out


def _pitfalls(inputs, serve, train, pools, fab, pc, total_nodes) -> list[Pitfall]:
    a = inputs.assumptions
    out: list[Pitfall] = []
    for s in serve:
        name, sp = s.plan.request.name, s.plan
        if not sp.fits:
            out.append(
                Pitfall(
                    "does_not_fit",
                    "error",
                    f"{sp.request.model.name} does not fit on {s.node.gpus} x {sp.request.gpu.name} per node even with pipeline stages",
                    name,
                )
            )
            continue
        c = sp.chosen
        if not c.latency_ok:
            out.append(
                Pitfall(
                    "latency",
                    "warning",
                    f"latency targets not met: TTFT {c.ttft_s * 1000:.0f} ms, TPOT {c.tpot_batch1_s * 1000:.1f} ms at batch 1",
                    name,
                )
            )
        if c.tp > 1 and not sp.request.gpu.nvlink_gb_s:
            out.append(
                Pitfall(
                    "tp_without_nvlink",
                    "warning",
                    f"tensor parallelism {c.tp} over PCIe ({sp.request.gpu.pcie_gb_s:.0f} GB/s): all-reduces slow every token",
                    name,
                )
            )
        if c.pp > 1 and inputs.network.kind == "ethernet":
            out.append(
                Pitfall(
                    "slow_network",
                    "warning",
                    f"pipeline stages across nodes over {inputs.network.name}",
                    name,
                )
            )
        if c.replicas == 1:
            out.append(
                Pitfall(
                    "single_point_of_failure",
                    "warning",
                    "one replica: a node or GPU failure takes the endpoint down; set min_replicas: 2",
                    name,
                )
            )
        if s.distribution:
            d = s.distribution
            one = max(
                d.size_bytes / (inputs.storage.read_gb_s * 1e9),
                d.size_bytes / (inputs.node_network_gb_s(s.node) * 1e9),
            )
            out.extend(storage_pitfalls(name, d.cold_s, d.nodes, d.warm_s, one))
    for t in train:
        name, tp = t.plan.request.name, t.plan
        if not tp.fits:
            out.append(
                Pitfall(
                    "does_not_fit",
                    "error",
                    f"no layout fits {tp.request.model.name} in the memory of {tp.gpus} x "
                    f"{tp.request.gpu.name}; no training time is given",
                    name,
                )
            )
            continue
        have = inputs.node_network_gb_s(t.node) * 8
        p = network_pitfall(name, tp.step_comm_s, tp.step_compute_s, tp.break_even_gbit_s, have)
        if p:
            out.append(p)
        p = checkpoint_pitfall(name, t.checkpoint_write_s, a.checkpoint_interval_minutes)
        if p:
            out.append(p)
        target = tp.request.target_seconds
        if target and tp.seconds > target * 1.0001:
            out.append(
                Pitfall(
                    "duration",
                    "warning",
                    f"takes {tp.seconds / 86400:.1f} days, over the {target / 86400:.1f}-day target",
                    name,
                )
            )
        if tp.layout and tp.layout.tp > 1 and not tp.request.gpu.nvlink_gb_s:
            out.append(
                Pitfall(
                    "tp_without_nvlink",
                    "warning",
                    f"tensor parallelism {tp.layout.tp} over PCIe",
                    name,
                )
            )
    if total_nodes > 1:
        if fab.leaves == 1 and fab.spines == 0:
            out.append(
                Pitfall(
                    "single_point_of_failure",
                    "info",
                    f"one {inputs.network.name} switch connects all {total_nodes} nodes; a second switch (dual-homed nodes) removes that single point",
                )
            )
        if fab.three_tier_needed:
            out.append(
                Pitfall(
                    "slow_network",
                    "warning",
                    "more leaves than a spine has ports: a three-tier fabric is needed",
                )
            )
        if inputs.storage.key.startswith("nfs"):
            out.append(
                Pitfall(
                    "single_point_of_failure",
                    "info",
                    f"shared storage is one server ({inputs.storage.name}); its failure stops loading models and checkpoints",
                )
            )
    elif total_nodes == 1:
        out.append(Pitfall("single_point_of_failure", "warning", "everything runs on one node"))
    for p in pools:
        if nodes_per_rack(p.node, a.rack_power_kw) == 0:
            out.append(
                Pitfall(
                    "power",
                    "error",
                    f"one {p.node.name} draws {p.node.power_w / 1000:.1f} kW, over the {a.rack_power_kw:g} kW rack budget",
                )
            )
    if inputs.budget_usd and pc.capex_usd > inputs.budget_usd:
        out.append(
            Pitfall(
                "budget",
                "error",
                f"capital cost ${pc.capex_usd:,.0f} exceeds the ${inputs.budget_usd:,.0f} budget",
            )
        )
    return out


# --- JSON --------------------------------------------------------------------------


def _opt(o) -> dict | None:
    if o is None:
        return None
    return {
        "tensor_parallel": o.tp,
        "pipeline_parallel": o.pp,
        "expert_parallel": o.ep,
        "gpus_per_replica": o.gpus_per_replica,
        "fits": o.fits,
        "weights_per_gpu_bytes": o.weights_per_gpu,
        "kv_capacity_tokens": int(o.kv_capacity_tokens),
        "max_batch": o.max_batch,
        "batch": o.batch,
        "ttft_s": o.ttft_s,
        "tpot_s": o.tpot_s,
        "tpot_batch1_s": o.tpot_batch1_s,
        "replica_requests_per_s": o.replica_rps,
        "replica_output_tokens_per_s": o.replica_tokens_per_s,
        "replicas": o.replicas,
        "total_gpus": o.total_gpus,
        "latency_ok": o.latency_ok,
        "memory_per_gpu_bytes": dict(o.memory_per_gpu),
    }


def _serve_dict(s: ServeResult) -> dict:
    sp, r = s.plan, s.plan.request
    return {
        "name": r.name,
        "model": r.model.name,
        "model_sources": dict(r.model.sources),
        "gpu": r.gpu.name,
        "node": s.node.key,
        "precision": r.precision,
        "kv_cache_dtype": r.kv_precision,
        "kv_precision": r.kv_precision,  # older name of kv_cache_dtype
        "sliding_window": r.model.sliding_window,
        "max_context": r.model.max_context,
        "params": sp.params,
        "non_embedding_params": param_counts(r.model).non_embedding,
        "active_params": sp.active_params,
        "weight_bytes": sp.weight_bytes,
        "kv_bytes_per_token": sp.kv_bytes_per_token,
        "kv_bytes_per_sequence": sp.kv_bytes_per_sequence,
        "context_length": r.context_length,
        "demand": {
            "requests_per_second": r.requests_per_second,
            "concurrent_users": r.concurrent_users,
            "prompt_tokens": r.prompt_tokens,
            "output_tokens": r.output_tokens,
            "ttft_target_s": r.ttft_s,
            "tpot_target_s": r.tpot_s,
        },
        "fits": sp.fits,
        "chosen": _opt(sp.chosen),
        "options": [_opt(o) for o in sp.options],
        "nodes": s.nodes,
        "model_load": None
        if not s.distribution
        else {
            "size_bytes": s.distribution.size_bytes,
            "nodes": s.distribution.nodes,
            "cold_s": s.distribution.cold_s,
            "warm_s": s.distribution.warm_s,
            "storage_bound": s.distribution.storage_bound,
        },
        "throughput_curve": [
            {"replicas": n, "requests_per_s": rps}
            for n, rps in throughput_curve(sp, max(4, 2 * (sp.chosen.replicas if sp.chosen else 1)))
        ],
        "notes": list(sp.notes),
    }


def _train_dict(t: TrainResult) -> dict:
    tp, r = t.plan, t.plan.request
    lay = tp.layout
    return {
        "name": r.name,
        "model": r.model.name,
        "model_sources": dict(r.model.sources),
        "gpu": r.gpu.name,
        "node": t.node.key,
        "method": r.method,
        "params": tp.params,
        "non_embedding_params": param_counts(r.model).non_embedding,
        "trainable_params": tp.trainable_params,
        "tokens": r.tokens,
        "flops_per_token": tp.flops_per_token,
        "total_flops": tp.total_flops,
        "mfu": tp.mfu,
        "optimizer": r.optimizer,
        "offload_optimizer": r.offload_optimizer,
        "gpus": tp.gpus,
        "nodes": tp.nodes,
        "gpus_for_target": tp.gpus_for_target,
        "fits": tp.fits,
        "layout": None
        if lay is None
        else {
            "strategy": lay.strategy,
            "data_parallel": lay.dp,
            "tensor_parallel": lay.tp,
            "pipeline_parallel": lay.pp,
            "context_parallel": lay.cp,
            "expert_parallel": lay.ep,
            "fits": lay.fits,
            "memory_per_gpu_bytes": lay.memory.as_dict(),
            "gpu_memory_bytes": r.gpu.memory_bytes,
        },
        "steps": tp.steps,
        "global_batch_tokens": r.global_batch_tokens,
        "step_compute_s": tp.step_compute_s,
        "step_comm_s": tp.step_comm_s,
        "step_context_parallel_s": tp.step_cp_s,
        "step_expert_parallel_s": tp.step_ep_s,
        "comm_bytes_per_node_per_step": tp.comm_bytes_per_node,
        "network_bound": tp.network_bound,
        "break_even_gbit_s_per_node": tp.break_even_gbit_s,
        # no duration for a run that does not fit: it would be a number with no meaning
        "seconds": tp.seconds if tp.fits else None,
        "days": tp.seconds / 86400 if tp.fits else None,
        "compute_bound_seconds": tp.compute_bound_seconds if tp.fits else None,
        "checkpoint_bytes": tp.checkpoint_bytes,
        "checkpoint_write_s": t.checkpoint_write_s,
        "energy_usd": t.energy_usd if tp.fits else None,
        "time_vs_nodes": [{"nodes": n, "days": d} for n, d in t.time_vs_nodes],
        "notes": list(tp.notes),
    }


def plan_to_dict(plan: Plan) -> dict:
    pc, fab, inp = plan.power_cost, plan.fabric, plan.inputs
    return {
        "name": inp.name,
        "description": inp.description,
        "topology": plan.topology,
        "serve": [_serve_dict(s) for s in plan.serve],
        "train": [_train_dict(t) for t in plan.train],
        "pools": [
            {
                "name": p.name,
                "role": p.role,
                "node": p.node.key,
                "node_name": p.node.name,
                "nodes": p.nodes,
                "gpus": p.gpus,
                "gpus_used": p.gpus_used,
                "workloads": list(p.workloads),
            }
            for p in plan.pools
        ],
        "network": {
            "name": fab.network.name,
            "gbit_s_per_port": fab.network.gbit_s,
            "ports": fab.ports,
            "leaf_switches": fab.leaves,
            "spine_switches": fab.spines,
            "three_tier_needed": fab.three_tier_needed,
            "sources": dict(fab.network.sources),
        },
        "storage": {
            "name": inp.storage.name,
            "read_gb_s": inp.storage.read_gb_s,
            "write_gb_s": inp.storage.write_gb_s,
            "sources": dict(inp.storage.sources),
        },
        "totals": {
            "nodes": sum(p.nodes for p in plan.pools),
            "gpus": sum(p.gpus for p in plan.pools),
            "gpus_used": sum(p.gpus_used for p in plan.pools),
            "switches": fab.switches,
            "racks": pc.racks,
            "it_kw": pc.it_kw,
            "facility_kw": pc.facility_kw,
            "cooling_btu_per_hour": pc.btu_per_hour,
            "capex_usd": pc.capex_usd,
            "node_capex_usd": pc.node_capex_usd,
            "network_capex_usd": pc.network_capex_usd,
            "energy_usd_per_month": pc.energy_usd_per_month,
            "amortization_usd_per_month": pc.amortization_usd_per_month,
            "monthly_usd": pc.monthly_usd,
            "budget_usd": inp.budget_usd,
        },
        "pitfalls": [p.as_dict() for p in plan.pitfalls],
        "warnings": [{"field": f, "message": m} for f, m in plan.warnings],
        "assumptions": inp.assumptions.as_dict(),
    }
