"""Network and data-movement arithmetic: gradient traffic, transfer times.

Sources:
- Ring all-reduce moves 2·(n-1)/n of the buffer through every member (Patarasuk & Yuan 2009,
  "Bandwidth optimal all-reduce algorithms for clusters of workstations"; NCCL's nccl-tests
  PERFORMANCE.md: busBw = algBw · 2(n-1)/n).
- Hierarchical all-reduce (reduce inside a node over NVLink, all-reduce across nodes, broadcast
  back; as NCCL's tree/ring over nodes): what crosses a node's NICs is 2·(k-1)/k of the
  gradients the node holds, for k nodes, whatever the GPUs per node.
- ZeRO Sec. 7.2: stages 1-2 move the same 2Ψ as DDP (reduce-scatter + all-gather);
  stage 3 moves 3Ψ (1.5x) because parameters are gathered in forward and backward.
- Context parallelism: Megatron-LM's context-parallel docs (ring of point-to-point KV
  exchanges overlapped with attention). Expert parallelism: GShard (arXiv:2006.16668),
  DeepSpeed-MoE (arXiv:2201.05596), DeepSeek-V3 (arXiv:2412.19437) for the all-to-all
  volume; alpha-beta cost per call (Hockney 1994) with the planner's per-collective latency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from aicluster.planner.assumptions import Assumptions
from aicluster.planner.hardware import Gpu

GRAD_BYTES = 2  # gradients reduced in bf16 (PyTorch DDP reduces in the gradient dtype)


def ring_allreduce_bytes(buffer_bytes: float, members: int) -> float:
    """Bytes each member sends (and receives) in a ring all-reduce of `buffer_bytes`."""
    if members <= 1:
        return 0.0
    return 2 * (members - 1) / members * buffer_bytes


def gradient_sync(
    trainable_params: float, nodes: int, gpus_per_node: int, mp: int, strategy: str
) -> float:
    """Bytes crossing each node's network per optimizer step for data-parallel sync.

    A node holds the gradients of max(1, mp / gpus_per_node)-th of the model when the
    model-parallel group (tp x pp) spans several nodes, else of the whole model.
    """
    if nodes <= 1:
        return 0.0
    span = max(1.0, mp / gpus_per_node)
    dp_nodes = max(1, round(nodes / span))
    held = trainable_params * GRAD_BYTES / span
    factor = 1.5 if strategy == "zero3" else 1.0
    return factor * ring_allreduce_bytes(held, dp_nodes)


def transfer_s(size_bytes: float, gb_s: float) -> float:
    return size_bytes / (gb_s * 1e9) if gb_s > 0 else float("inf")


# --- context and expert parallelism (per-GPU collectives, alpha-beta) ------------------


@dataclass(frozen=True)
class Links:
    """What one GPU can send per second to another, per direction, after efficiency, and
    the fixed cost of one collective call (alpha of the alpha-beta model: Hockney 1994,
    "The communication challenge for MPP"; the per-collective latency the planner charges
    tensor-parallel all-reduces, `Assumptions.collective_latency_s`)."""

    nvlink_b_s: float  # to a GPU of the same node: NVLink per direction (or PCIe)
    network_b_s: float  # to a GPU of another node: its share of the node's NICs
    alpha_s: float

    def rate(self, crosses_nodes: bool) -> float:
        return self.network_b_s if crosses_nodes else self.nvlink_b_s


def gpu_links(
    gpu: Gpu, a: Assumptions, node_network_gb_s: float, gpus_per_node: int, ranks: int = 2
) -> Links:
    """NVLink per direction (half the catalog's total) x `nvlink_efficiency`, or PCIe; the
    network as the node's NICs shared by its GPUs x `network_efficiency` (rail-optimised
    nodes give every GPU its own NIC: DGX H100 has 8 x 400 Gb/s for 8 GPUs); alpha of a
    collective among `ranks` GPUs (`Assumptions.collective_latency_s`; 2 for a ring's
    point-to-point step)."""
    intra = (gpu.nvlink_gb_s / 2 if gpu.nvlink_gb_s else gpu.pcie_gb_s) * 1e9
    inter = node_network_gb_s / max(1, gpus_per_node) * 1e9
    return Links(
        intra * a.nvlink_efficiency,
        inter * a.network_efficiency,
        a.collective_latency_s(ranks),
    )


def ring_step_s(chunk_bytes: float, rate_b_s: float, alpha_s: float) -> float:
    """One point-to-point step of a ring: alpha + bytes / rate."""
    return alpha_s + chunk_bytes / rate_b_s


def ring_attention_exposed_s(
    chunk_bytes: float,
    cp: int,
    rate_b_s: float,
    alpha_s: float,
    fwd_attention_s: float,
    recompute: bool = False,
) -> tuple[float, float]:
    """(ring time, time not hidden by attention) of context parallelism for one layer and
    one micro-batch on one GPU.

    Megatron-LM context parallelism (docs/source/api-guide/context_parallel.rst; ring
    attention, Liu et al. 2023, arXiv:2310.01889): each of the `cp` ranks holds a chunk of
    the sequence; its K and V travel round the ring in cp - 1 point-to-point steps in the
    forward pass; backward gathers K and V again and sends their gradients back, two chunks
    per step (cp - 1 steps). Each step overlaps with the attention of the block already
    received, 1/cp of the rank's attention (backward: twice the forward's), so only a step's
    excess over that block is exposed. `recompute` (full activation checkpointing) reruns the
    forward ring. alpha-beta per step: `ring_step_s`.
    """
    if cp <= 1:
        return 0.0, 0.0
    block = fwd_attention_s / cp
    fwd = ring_step_s(chunk_bytes, rate_b_s, alpha_s)
    bwd = ring_step_s(2 * chunk_bytes, rate_b_s, alpha_s)
    passes = 2 if recompute else 1
    ring = (cp - 1) * (passes * fwd + bwd)
    exposed = (cp - 1) * (passes * max(0.0, fwd - block) + max(0.0, bwd - 2 * block))
    return ring, exposed


def expert_rank_probability(experts: int, active: int, ep: int) -> float:
    """Probability that a token routed to `active` of `experts` experts (uniformly, without
    repetition) needs a given one of the `ep` ranks, which holds experts/ep of them:
    1 - C(E - E/ep, k) / C(E, k). A token is sent once to each rank it needs (DeepEP's
    dispatch; DeepSeek-V3 report, arXiv:2412.19437, Sec. 3.2.2). With k = 1 this is 1/ep, and
    the copies leaving a rank come to (ep-1)/ep of its tokens, the GShard / DeepSpeed-MoE
    all-to-all volume (Lepikhin et al. 2020, arXiv:2006.16668; Rajbhandari et al. 2022,
    arXiv:2201.05596)."""
    if ep <= 1:
        return 1.0
    per_rank = experts // ep
    k = min(active, experts)
    return 1 - math.comb(experts - per_rank, k) / math.comb(experts, k)


def all_to_all_s(
    tokens: float,
    hidden: int,
    bytes_per_value: float,
    experts: int,
    active: int,
    ep: int,
    ep_per_node: int,
    links: Links,
) -> float:
    """One MoE dispatch (or combine) among `ep` ranks: alpha + the larger of the bytes to
    ranks in the same node over NVLink and to ranks in other nodes over the network (sent
    at the same time). A rank sends each of its `tokens` (hidden x bytes each) to each other
    rank that holds one of its experts: (ep - 1)·p copies per token, of which
    (ep_per_node - 1)·p stay in the node (`expert_rank_probability`). k = 1:
    tokens x hidden x bytes x (ep-1)/ep, as GShard and DeepSpeed-MoE count it."""
    if ep <= 1:
        return 0.0
    p = expert_rank_probability(experts, active, ep)
    local = max(1, min(ep, ep_per_node))
    one = tokens * hidden * bytes_per_value * p
    inside = one * (local - 1) / links.nvlink_b_s
    across = one * (ep - local) / links.network_b_s
    return links.alpha_s + max(inside, across)
