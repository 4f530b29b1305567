"""Storage arithmetic: model and checkpoint sizes, time to get a model onto N nodes.

Model: when N nodes start at once, each pulls the whole model from shared storage. The
storage serves all of them together at its aggregate read bandwidth, and each node takes
it in no faster than its own network, so

    cold load = max(N · size / storage_read, size / node_network)

With a node-local cache (NVMe), a node that already has the model reads it locally:

    warm load = size / nvme_read

(simple bandwidth bounds; latency and file-system metadata costs are ignored).
A checkpoint written by all ranks at once is bounded by the storage write bandwidth:
write = size / storage_write. Sizes: full training state is 14 bytes per trainable
parameter (bf16 weights 2 + fp32 master, momentum and variance 12; [ZeRO Sec. 3.1]).
"""

from __future__ import annotations

from dataclasses import dataclass

from aicluster.planner.network import transfer_s


@dataclass(frozen=True)
class Distribution:
    size_bytes: float
    nodes: int
    cold_s: float
    warm_s: float
    storage_bound: bool  # the shared storage, not the nodes' network, limits the cold load


def distribute(
    size_bytes: float,
    nodes: int,
    storage_read_gb_s: float,
    node_gb_s: float,
    nvme_gb_s: float,
) -> Distribution:
    nodes = max(1, nodes)
    shared = transfer_s(nodes * size_bytes, storage_read_gb_s)
    per_node = transfer_s(size_bytes, node_gb_s)
    return Distribution(
        size_bytes=size_bytes,
        nodes=nodes,
        cold_s=max(shared, per_node),
        warm_s=transfer_s(size_bytes, nvme_gb_s),
        storage_bound=shared >= per_node,
    )


def checkpoint_write_s(size_bytes: float, storage_write_gb_s: float) -> float:
    return transfer_s(size_bytes, storage_write_gb_s)
