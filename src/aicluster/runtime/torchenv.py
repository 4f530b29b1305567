"""The torchrun-compatible environment of one worker of a gang.

Vocabulary: `placement[rank]` is the node of each rank. NODE_RANK numbers the
distinct nodes in order of first appearance; LOCAL_RANK numbers the ranks on one
node. CUDA_VISIBLE_DEVICES lists the GPUs the engine granted this worker alone
(empty when it has none, so that a CPU worker never grabs a GPU).
"""

from __future__ import annotations


def rank_layout(placement: list[str] | tuple[str, ...], rank: int) -> dict[str, int]:
    nodes: list[str] = []
    for node in placement:
        if node not in nodes:
            nodes.append(node)
    node = placement[rank]
    return {
        "NODE_RANK": nodes.index(node),
        "LOCAL_RANK": placement[:rank].count(node),
        "LOCAL_WORLD_SIZE": placement.count(node),
        "NNODES": len(nodes),
    }


def worker_env(
    *,
    placement: list[str] | tuple[str, ...],
    rank: int,
    master_addr: str,
    master_port: int,
    gpu_ids: list[int] | list[str],
) -> dict[str, str]:
    layout = rank_layout(placement, rank)
    env = {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "WORLD_SIZE": str(len(placement)),
        "RANK": str(rank),
        "GROUP_RANK": str(layout["NODE_RANK"]),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(len(placement)),
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpu_ids),
    }
    env.update({k: str(v) for k, v in layout.items()})
    return env
