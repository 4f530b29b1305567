"""Gang placement: all workers or none, on as few nodes as possible.

Invariant: a returned placement fits the free capacity it was computed on, and
every worker's node matches the gang's GPU model when one is asked.
"""

from __future__ import annotations

from aicluster.core.model import GangRequest, NodeView, Res


def model_matches(node: NodeView, gang: GangRequest) -> bool:
    if gang.gpu_model is None:
        return True
    return (node.gpu_model or "").lower() == gang.gpu_model.lower()


def place_gang(
    gang: GangRequest, nodes: tuple[NodeView, ...], free: dict[str, Res]
) -> tuple[str, ...] | None:
    """Pack workers onto the nodes with room for the most of them first.

    Ties break by node name so that the same snapshot gives the same answer.
    """
    room = []
    for n in nodes:
        if n.node_id not in free or not model_matches(n, gang):
            continue
        k = min(gang.per_worker.count_in(free[n.node_id]), gang.workers)
        if k > 0:
            room.append((-k, n.name, n.node_id, k))
    room.sort()
    placement: list[str] = []
    for _, _, node_id, k in room:
        take = min(k, gang.workers - len(placement))
        placement += [node_id] * take
        if len(placement) == gang.workers:
            return tuple(placement)
    return None


def why_not(gang: GangRequest, nodes: tuple[NodeView, ...], free: dict[str, Res]) -> str:
    """A sentence a user can act on."""
    r = gang.per_worker
    need = f"{gang.workers} worker(s) x ({r.cpus:g} CPU, {_gib(r.memory)}, {r.gpus} GPU"
    need += f" {gang.gpu_model})" if gang.gpu_model else ")"
    candidates = [n for n in nodes if n.schedulable and model_matches(n, gang)]
    if not candidates:
        return f"needs {need}; no node has GPU model {gang.gpu_model}"
    if place_gang(gang, nodes, {n.node_id: n.capacity for n in nodes if n.schedulable}) is None:
        total = sum((n.capacity for n in candidates), Res())
        return (
            f"could never fit: needs {need}; the cluster has {total.cpus:g} CPU, "
            f"{_gib(total.memory)}, {total.gpus} GPU on {len(candidates)} matching node(s)"
        )
    return f"waiting for capacity: needs {need}"


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB"
