"""The pitfalls a plan is checked for, named so a report can list them.

Codes (the seeds' pitfalls first):
- slow_network: inter-node gradient traffic takes longer than the step's compute, so the
  network, not the GPUs, sets the pace (error); or more than half of it (warning: only
  perfect overlap hides it).
- storage_bottleneck: loading a model onto every node from shared storage, or writing a
  checkpoint, takes long enough to matter.
- single_point_of_failure: one replica, one node, one switch or one storage server that
  takes everything down with it.
- power: a node that no rack can power, or a plan that needs more racks than expected.
- does_not_fit, latency, tp_without_nvlink, budget, duration: the plan's own limits.

Thresholds are planning heuristics (stated in the constants below), not standards.
"""

from __future__ import annotations

from dataclasses import dataclass

COLD_LOAD_WARN_S = 600.0  # a cold start of every serving node over 10 minutes
SCALE_OUT_WARN_S = 120.0  # adding one replica takes over 2 minutes
CHECKPOINT_SHARE_WARN = 0.05  # a synchronous checkpoint costs over 5% of the interval
COMM_SHARE_WARN = 0.5


@dataclass(frozen=True)
class Pitfall:
    code: str
    severity: str  # error | warning | info
    message: str
    workload: str | None = None

    def as_dict(self) -> dict:
        return {
            "code": self.code,
            "severity": self.severity,
            "workload": self.workload,
            "message": self.message,
        }


def network_pitfall(
    name: str, comm_s: float, compute_s: float, needed_gbit: float, have_gbit: float
):
    if compute_s <= 0 or comm_s <= 0:
        return None
    share = comm_s / compute_s
    text = (
        f"gradient sync {comm_s:.2f}s per step vs {compute_s:.2f}s of compute "
        f"({share:.0%}); each node needs about {needed_gbit:,.0f} Gb/s, has {have_gbit:,.0f} Gb/s"
    )
    if share > 1:
        return Pitfall("slow_network", "error", "network-bound: " + text, name)
    if share > COMM_SHARE_WARN:
        return Pitfall("slow_network", "warning", "only perfect overlap hides it: " + text, name)
    return None


def storage_pitfalls(name: str, cold_s: float, nodes: int, warm_s: float, one_node_s: float):
    out = []
    if cold_s > COLD_LOAD_WARN_S:
        out.append(
            Pitfall(
                "storage_bottleneck",
                "warning",
                f"loading the model onto {nodes} nodes at once takes {cold_s / 60:.1f} min from "
                f"shared storage; a node-local cache makes a restart take {warm_s:.0f}s",
                name,
            )
        )
    elif one_node_s > SCALE_OUT_WARN_S:
        out.append(
            Pitfall(
                "storage_bottleneck",
                "warning",
                f"one new replica waits {one_node_s:.0f}s for its model; cache it on local NVMe",
                name,
            )
        )
    return out


def checkpoint_pitfall(name: str, write_s: float, interval_min: float):
    if write_s > CHECKPOINT_SHARE_WARN * interval_min * 60:
        return Pitfall(
            "storage_bottleneck",
            "warning",
            f"a checkpoint takes {write_s / 60:.1f} min to write, over "
            f"{CHECKPOINT_SHARE_WARN:.0%} of the {interval_min:.0f}-min interval; "
            "write asynchronously or to faster storage",
            name,
        )
    return None
