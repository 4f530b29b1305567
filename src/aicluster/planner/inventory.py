"""`plan --cluster`: the same questions against a running cluster's real inventory.

Input is plain data, the node dicts the API returns (`node_id`, `name`, `alive`, `gpus`,
`gpu_model`, `pool`, `allocated: {gpus}` ...), so this is tested without a server.
Each serving workload is sized for each GPU kind the cluster has (same arithmetic as the
plan), then its replicas are placed greedily on the nodes with the most free GPUs;
training takes what is left. Placement here is advice, not a reservation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from aicluster.planner.hardware import Catalog, Gpu
from aicluster.planner.inference import plan_serving
from aicluster.planner.inputs import PlanInputs
from aicluster.planner.training import plan_training


@dataclass
class InvNode:
    name: str
    gpus: int
    free_gpus: int
    gpu_model: str
    gpu: Gpu | None
    pool: str | None


def inventory(nodes: list[dict], catalog: Catalog) -> tuple[list[InvNode], list[str]]:
    """Alive nodes with GPUs, matched to catalog GPUs; notes for the ones that are not."""
    out, notes = [], []
    for n in nodes:
        name = str(n.get("name") or n.get("node_id") or "?")
        if not n.get("alive", True):
            notes.append(f"{name}: not alive, skipped")
            continue
        gpus = int(n.get("gpus") or 0)
        if gpus <= 0:
            continue
        used = int((n.get("allocated") or {}).get("gpus") or 0)
        model = str(n.get("gpu_model") or "")
        gpu = catalog.gpu_for_model_name(model) if model else None
        if gpu is None:
            notes.append(f"{name}: GPU model {model or 'unknown'!r} is not in the catalog, skipped")
            continue
        out.append(InvNode(name, gpus, max(0, gpus - used), model, gpu, n.get("pool")))
    return out, notes


def _place(nodes: list[InvNode], replicas: int, per_replica: int) -> list[dict]:
    placed: list[dict] = []
    left = replicas
    for node in sorted(nodes, key=lambda n: -n.free_gpus):
        k = min(left, node.free_gpus // per_replica)
        if k > 0:
            node.free_gpus -= k * per_replica
            placed.append({"node": node.name, "replicas": k, "gpus": k * per_replica})
            left -= k
        if left == 0:
            break
    return placed


def fit_inventory(inputs: PlanInputs, nodes: list[dict], catalog: Catalog) -> dict:
    """Per workload: fits or not, where, how many replicas (or GPUs), and why not."""
    inv, notes = inventory(nodes, catalog)
    kinds: dict[str, list[InvNode]] = {}
    for n in inv:
        kinds.setdefault(n.gpu.key, []).append(n)
    result = {
        "nodes": len(inv),
        "free_gpus": sum(n.free_gpus for n in inv),
        "notes": notes,
    }
    result["serve"] = [_fit_serve(inputs, r, kinds) for r in inputs.serve]
    result["train"] = [_fit_train(inputs, r, kinds) for r in inputs.train]
    return result


def _fit_serve(inputs: PlanInputs, r, kinds: dict[str, list[InvNode]]) -> dict:
    best = None
    for key, group in sorted(kinds.items()):
        per_node = max(n.gpus for n in group)
        sp = plan_serving(replace(r, gpu=group[0].gpu, gpus_per_node=per_node), inputs.assumptions)
        if not sp.chosen or sp.chosen.pp > 1:
            continue
        c = sp.chosen
        free = sum(n.free_gpus // c.gpus_per_replica for n in group)
        cand = (free >= c.replicas, -c.total_gpus, free, key, c)
        if best is None or cand[:3] > best[:3]:
            best = cand
    if best is None:
        return {
            "name": r.name,
            "fits": False,
            "reason": "no GPU kind in the cluster holds one replica on a node",
        }
    ok, _, _, key, c = best
    placement = _place(kinds[key], c.replicas, c.gpus_per_replica)
    placed = sum(p["replicas"] for p in placement)
    return {
        "name": r.name,
        "fits": ok,
        "gpu": kinds[key][0].gpu.name,
        "tensor_parallel": c.tp,
        "replicas_needed": c.replicas,
        "replicas_placed": placed,
        "replica_requests_per_s": c.replica_rps,
        "placement": placement,
        "reason": None if ok else f"only {placed} of {c.replicas} replicas fit in the free GPUs",
    }


def _fit_train(inputs: PlanInputs, r, kinds: dict[str, list[InvNode]]) -> dict:
    best = None
    for key, group in sorted(kinds.items()):
        free = sum(n.free_gpus for n in group)
        if free <= 0:
            continue
        per_node = max(n.gpus for n in group)
        want = r.gpus or free
        n = min(free, want)
        tp = plan_training(
            replace(r, gpu=group[0].gpu, gpus_per_node=per_node, gpus=n),
            inputs.assumptions,
        )
        cand = (tp.fits, -tp.seconds if tp.fits else 0.0, key, tp)
        if best is None or cand[:2] > best[:2]:
            best = cand
    if best is None:
        return {"name": r.name, "fits": False, "reason": "no free GPUs"}
    ok, _, key, tp = best
    lay = tp.layout
    out = {
        "name": r.name,
        "fits": ok,
        "gpu": kinds[key][0].gpu.name,
        "gpus": tp.gpus,
        "strategy": lay.strategy if lay else None,
        "network_bound": tp.network_bound,
        "reason": None if ok else "does not fit in the free GPUs' memory",
    }
    if ok:  # no duration for a run that does not fit
        out["days"] = tp.seconds / 86400
    return out
