"""The cluster that carries the workloads: pools of nodes, topology, network fabric.

Vocabulary: a pool is the nodes of one shape given to one role (serve or train);
the fabric is the node-to-node network: leaf switches the nodes plug into and, when one
switch is not enough, spine switches that join the leaves.

Fabric sizing: a two-tier non-blocking leaf-spine (folded Clos / fat-tree; Leiserson 1985,
"Fat-trees: universal networks for hardware-efficient supercomputing"; Al-Fares et al.
2008, "A scalable, commodity data center network architecture"): with k-port switches,
up to k ports fit on one switch; beyond that each leaf uses k/2 ports down and k/2 up,
so leaves = ceil(ports / (k/2)) and spines = ceil(leaves · (k/2) / k).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from aicluster.planner.hardware import Interconnect, NodeShape


@dataclass(frozen=True)
class Pool:
    name: str
    role: str  # serve | train
    node: NodeShape
    nodes: int
    gpus_used: int
    workloads: tuple[str, ...]

    @property
    def gpus(self) -> int:
        return self.nodes * self.node.gpus


@dataclass(frozen=True)
class Fabric:
    network: Interconnect
    ports: int
    leaves: int
    spines: int
    three_tier_needed: bool

    @property
    def switches(self) -> int:
        return self.leaves + self.spines


def serve_nodes(replicas: int, gpus_per_replica: int, gpus_per_node: int) -> int:
    """Replicas packed onto nodes: several small replicas share a node; a replica bigger
    than a node takes ceil(g / gpus_per_node) whole nodes."""
    if replicas <= 0:
        return 0
    if gpus_per_replica <= gpus_per_node:
        return math.ceil(replicas / (gpus_per_node // gpus_per_replica))
    return replicas * math.ceil(gpus_per_replica / gpus_per_node)


def pack_nodes(replica_gpus: list[int], gpus_per_node: int) -> int:
    """Nodes for replicas of several workloads sharing one pool: first-fit decreasing bin
    packing (Johnson 1974) of replicas that fit a node; bigger ones take whole nodes."""
    bins: list[int] = []
    whole = 0
    for g in sorted(replica_gpus, reverse=True):
        if g > gpus_per_node:
            whole += -(-g // gpus_per_node)
            continue
        for i, free in enumerate(bins):
            if free >= g:
                bins[i] -= g
                break
        else:
            bins.append(gpus_per_node - g)
    return whole + len(bins)


def fabric(network: Interconnect, ports: int) -> Fabric:
    k = max(2, network.switch_ports)
    if ports <= 1:
        return Fabric(network, ports, 0, 0, False)
    if ports <= k:
        return Fabric(network, ports, 1, 0, False)
    leaves = math.ceil(ports / (k // 2))
    spines = math.ceil(leaves * (k // 2) / k)
    return Fabric(network, ports, leaves, spines, leaves > k)


def topology(pools: list[Pool]) -> str:
    """single GPU / single node, multi-GPU / multi-node / hybrid (specialised node shapes)."""
    nodes = sum(p.nodes for p in pools)
    shapes = sorted({p.node.key for p in pools if p.nodes})
    if nodes <= 1:
        gpus = sum(p.gpus_used for p in pools)
        return "single node, one GPU" if gpus <= 1 else f"single node, multi-GPU ({gpus} GPUs)"
    if len(shapes) > 1:
        return f"hybrid: specialised nodes ({', '.join(shapes)})"
    return f"multi-node ({nodes} x {shapes[0]})"
