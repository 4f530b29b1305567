"""Trace-driven discrete-event simulator running the `core` scheduling policies.

from aicluster.sim import load_philly, team_cluster, simulate, summarise
report = summarise(simulate(jobs, cluster, policy="fair"))
"""

from aicluster.sim.cluster import (
    SimCluster,
    build_nodes,
    owned_cluster,
    shared_cluster,
    team_cluster,
)
from aicluster.sim.replay import SimConfig, SimResult, simulate
from aicluster.sim.report import Report, percentile, summarise
from aicluster.sim.traces import (
    TINY_PHILLY_VCS,
    TraceJob,
    load_60_job,
    load_philly,
    load_philly_vcs,
    synthetic,
)

__all__ = [
    "TINY_PHILLY_VCS",
    "Report",
    "SimCluster",
    "SimConfig",
    "SimResult",
    "TraceJob",
    "build_nodes",
    "load_60_job",
    "load_philly",
    "load_philly_vcs",
    "owned_cluster",
    "percentile",
    "shared_cluster",
    "simulate",
    "summarise",
    "synthetic",
    "team_cluster",
]
