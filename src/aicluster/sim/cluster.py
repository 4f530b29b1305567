"""Simulated clusters: nodes in racks, and team quotas, in one of two layouts.

- *shared* (`team_cluster`): every node in one pool "default"; each team is guaranteed a
  number of GPUs in it (a quota), not particular nodes.
- *owned* (`owned_cluster`): each team owns its nodes, a pool of its own named after the
  team, with its whole pool as its guarantee (how Philly's virtual clusters and most
  on-premise clusters work). Nothing stops other teams from using an owner's idle nodes:
  under the quota book's rules they borrow them (a team without quota in a pool may
  borrow its owner's unused guarantee), and a policy that reclaims (`fair`) preempts them
  when the owner needs its nodes back; a partitioned policy (`fifo`) keeps each team on
  its own pool. A gang never spans pools.

Invariant: node ids and names are "n0000", "n0001", ... in rack order, so that runs are
reproducible and node names sort in placement tie-break order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from aicluster.core.model import NodeView, Quota, Res

GiB = 2**30


@dataclass(frozen=True)
class SimCluster:
    nodes: tuple[NodeView, ...]
    quotas: tuple[Quota, ...]

    @property
    def gpus(self) -> int:
        return sum(n.capacity.gpus for n in self.nodes)


def build_nodes(
    count: int,
    gpus_per_node: int = 8,
    nodes_per_rack: int = 16,
    pool: str = "default",
    cpus: float = 64.0,
    memory: int = 512 * GiB,
    gpu_model: str | None = None,
    start: int = 0,
) -> tuple[NodeView, ...]:
    """`count` identical nodes, `nodes_per_rack` to a rack (each node its own NVLink
    domain), numbered from `start`."""
    return tuple(
        NodeView(
            node_id=f"n{i:04d}",
            name=f"n{i:04d}",
            capacity=Res(cpus, memory, gpus_per_node),
            pool=pool,
            gpu_model=gpu_model,
            rack=f"r{i // nodes_per_rack:03d}",
        )
        for i in range(start, start + count)
    )


def team_cluster(
    team_nodes: dict[str, int],
    scale: float = 1.0,
    gpus_per_node: int = 8,
    nodes_per_rack: int = 16,
    borrow_gpus: int | None = None,
) -> SimCluster:
    """Each team guaranteed its node count x `scale` (at least one node) of GPUs; the
    cluster is exactly the sum, in one pool "default", one cohort."""
    # half up (2.5 -> 3), not round()'s half to even (2.5 -> 2, 3.5 -> 4)
    sizes = {t: max(1, math.floor(n * scale + 0.5)) for t, n in sorted(team_nodes.items())}
    nodes = build_nodes(sum(sizes.values()), gpus_per_node, nodes_per_rack)
    quotas = tuple(
        Quota(team=t, pool="default", gpus=n * gpus_per_node, borrow_gpus=borrow_gpus)
        for t, n in sizes.items()
    )
    return SimCluster(nodes, quotas)


def owned_cluster(
    team_nodes: dict[str, int],
    scale: float = 1.0,
    gpus_per_node: int = 8,
    nodes_per_rack: int = 16,
    borrow_gpus: int | None = None,
) -> SimCluster:
    """Each team owns its node count x `scale` (at least one node) as a pool named after
    it, guaranteed all of it; nodes numbered team by team (teams in name order), so the
    cluster has exactly the nodes of `team_cluster` with the same arguments."""
    sizes = {t: max(1, math.floor(n * scale + 0.5)) for t, n in sorted(team_nodes.items())}
    nodes: list[NodeView] = []
    for team, n in sizes.items():
        nodes.extend(build_nodes(n, gpus_per_node, nodes_per_rack, pool=team, start=len(nodes)))
    quotas = tuple(
        Quota(team=t, pool=t, gpus=n * gpus_per_node, borrow_gpus=borrow_gpus)
        for t, n in sizes.items()
    )
    return SimCluster(tuple(nodes), quotas)


def shared_cluster(nodes: int, gpus_per_node: int = 8, nodes_per_rack: int = 16) -> SimCluster:
    """A cluster without quotas: one partition that every team shares."""
    return SimCluster(build_nodes(nodes, gpus_per_node, nodes_per_rack), ())
