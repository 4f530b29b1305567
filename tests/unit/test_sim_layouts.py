"""The simulator's cluster layouts: one shared pool, or each team owning its nodes."""

from __future__ import annotations

from aicluster.sim import SimConfig, TraceJob, owned_cluster, simulate, team_cluster


def test_owned_cluster_has_the_shared_clusters_nodes_in_one_pool_per_team():
    teams = {"b": 2, "a": 3}
    owned, shared = owned_cluster(teams, 0.5), team_cluster(teams, 0.5)
    assert [n.node_id for n in owned.nodes] == [n.node_id for n in shared.nodes]
    assert [n.pool for n in owned.nodes] == ["a", "a", "b"]  # 1.5 -> 2 nodes, 1 -> 1
    assert {(q.team, q.pool, q.gpus) for q in owned.quotas} == {("a", "a", 16), ("b", "b", 8)}


def _jobs() -> list[TraceJob]:
    """Team a fills its own node and more at t=0; team b submits a whole-node job at 100."""
    jobs = [TraceJob(f"a{i:02d}", "a", 0.0, 1000.0, 1) for i in range(16)]
    return [*jobs, TraceJob("b00", "b", 100.0, 500.0, 8)]


def _starts(policy: str) -> dict[str, float]:
    cluster = owned_cluster({"a": 1, "b": 1})
    result = simulate(_jobs(), cluster, policy, SimConfig(checkpoint_every_s=None))
    return {r.job.job_id: r.first_start for r in result.jobs}


def test_partitioned_fifo_keeps_each_team_on_its_own_nodes():
    starts = _starts("fifo")
    assert sorted(starts[f"a{i:02d}"] for i in range(16)) == [0.0] * 8 + [1000.0] * 8
    assert starts["b00"] == 100.0


def test_fair_lends_idle_nodes_and_takes_them_back_by_preemption():
    cluster = owned_cluster({"a": 1, "b": 1})
    result = simulate(_jobs(), cluster, "fair", SimConfig(checkpoint_every_s=None))
    starts = {r.job.job_id: r.first_start for r in result.jobs}
    assert all(starts[f"a{i:02d}"] == 0.0 for i in range(16))  # 8 of them on b's idle node
    assert starts["b00"] == 100.0  # b's node given back at once
    assert sum(r.preemptions for r in result.jobs) == 8
    assert all(r.finish is not None for r in result.jobs)
