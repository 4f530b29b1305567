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
"""

from __future__ import annotations

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
