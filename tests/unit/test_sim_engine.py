"""The trace simulator (aicluster.sim): loaders, the event loop, preemption costs, reports."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aicluster.core.model import Quota
from aicluster.sim import (
    SimConfig,
    TraceJob,
    build_nodes,
    load_60_job,
    load_philly,
    load_philly_vcs,
    percentile,
    shared_cluster,
    simulate,
    summarise,
    synthetic,
    team_cluster,
)
from aicluster.sim.cluster import SimCluster

# The real traces (../shared/traces beside the checkout, or AICLUSTER_TRACES); the loaders'
# formats are also checked on small inline samples below, which always run.
TRACES = Path(
    os.environ.get("AICLUSTER_TRACES") or Path(__file__).resolve().parents[3] / "shared" / "traces"
)
needs_traces = pytest.mark.skipif(
    not TRACES.is_dir(),
    reason=f"the real traces are not at {TRACES} (set AICLUSTER_TRACES to their folder)",
)


def test_load_60_job_format(tmp_path):
    path = tmp_path / "60_job.csv"
    path.write_text(
        "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
        "1,8,30,133,vgg11,147,23\n0,1,0,606,vgg19,164,30\n2,0,30,1,x,0.2,0\n"
    )
    jobs = load_60_job(path, team="t")
    assert [(j.job_id, j.submit, j.gpus, j.duration) for j in jobs] == [
        ("j000", 0.0, 1, 164.0),
        ("j001", 30.0, 8, 147.0),
        ("j002", 30.0, 1, 1.0),
    ]  # sorted by submit then id; at least 1 GPU and 1 s
    assert {j.team for j in jobs} == {"t"}


def test_load_philly_format(tmp_path):
    vcs = tmp_path / "vc.csv"
    vcs.write_text("vc,node num\nbig,64\n795a4c,1\n")
    assert load_philly_vcs(vcs) == {"big": 64}  # the tiny VCs are dropped
    path = tmp_path / "philly.csv"
    path.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-01 00:01:00,66.0,1,66.0,big\n"
        "2017-10-01 00:00:00,0.0,0,0.0,big\n"
        "2017-09-30 23:59:59,10.0,1,10.0,big\n"  # before the window
        "2017-10-01 00:02:00,10.0,8,80.0,other\n"  # not a kept team
        ",10.0,1,10.0,big\n"  # no timestamp
    )
    jobs = load_philly(path, {"big"})
    assert [(j.job_id, j.submit, j.duration, j.gpus) for j in jobs] == [
        ("p0000001", 0.0, 1.0, 1),
        ("p0000000", 60.0, 66.0, 1),
    ]
    assert len(load_philly(path)) == 3  # every team


def test_trace_replays_do_not_depend_on_the_machine(tmp_path, monkeypatch):
    """Issue 17 (5): timestamps read as UTC whatever the time zone (a DST change fell
    inside the window), ties in submit time kept in row order past row 9, team sizes
    scaled half up."""
    import time

    path = tmp_path / "philly.csv"
    rows = ["2017-11-05 00:00:00", "2017-11-06 00:00:00"] + ["2017-11-06 00:00:00"] * 10
    path.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        + "".join(f"{ts},10.0,1,10.0,big\n" for ts in rows)
    )
    for tz in ("UTC", "America/Los_Angeles"):
        monkeypatch.setenv("TZ", tz)
        time.tzset()
        jobs = load_philly(path, start="2017-11-05")
        assert jobs[1].submit - jobs[0].submit == 86400.0, tz  # 25 h in Los Angeles
    monkeypatch.delenv("TZ")
    time.tzset()
    assert [j.job_id for j in jobs[1:]] == [f"p{i:07d}" for i in range(1, 12)]
    assert [q.gpus for q in team_cluster({"a": 10, "b": 14}, 0.25).quotas] == [24, 32]


# -- loaders ----------------------------------------------------------------------------


@needs_traces
def test_load_60_job():
    jobs = load_60_job(TRACES / "60_job.csv")
    assert len(jobs) == 60
    assert [j.submit for j in jobs] == sorted(j.submit for j in jobs)
    assert sorted({j.gpus for j in jobs}) == [1, 2, 4, 8]
    assert min(j.duration for j in jobs) == 121 and max(j.duration for j in jobs) == 1800


@needs_traces
def test_load_philly_window_and_teams():
    vcs = load_philly_vcs(TRACES / "philly_vc.csv")
    assert len(vcs) == 11 and sum(vcs.values()) == 352
    jobs = load_philly(TRACES / "philly.csv", set(vcs))
    assert len(jobs) == 68503
    assert jobs[0].submit >= 0 and jobs[-1].submit < 61 * 86400
    assert {j.team for j in jobs} == set(vcs)
    cluster = team_cluster(vcs, 0.25)
    assert cluster.gpus == 704 and sum(q.gpus for q in cluster.quotas) == 704


def test_load_philly_sorts_and_filters(tmp_path):
    f = tmp_path / "p.csv"
    f.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-02 00:00:10,100.0,2,200.0,x\n"
        "2017-10-01 00:00:00,50.0,1,50.0,y\n"
        "2017-09-30 23:59:59,5.0,1,5.0,x\n"
        "2017-10-01 00:01:00,0.0,16,0.0,z\n\n"
    )
    jobs = load_philly(f, {"x", "y"})
    assert [(j.team, j.submit, j.gpus) for j in jobs] == [
        ("y", 0.0, 1),
        ("x", 86410.0, 2),
    ]
    assert len(load_philly(f)) == 3 and load_philly(f)[1].duration == 1.0


def test_gang_shape_uses_node_sized_workers():
    assert TraceJob("j", "t", 0, 1, 4).shape(8) == (1, 4)
    assert TraceJob("j", "t", 0, 1, 16).shape(8) == (2, 8)
    assert TraceJob("j", "t", 0, 1, 12).shape(8) == (3, 4)
    assert TraceJob("j", "t", 0, 1, 8).shape(4) == (2, 4)


def test_synthetic_is_seeded():
    teams = {"a": 1.0, "b": 2.0}
    assert synthetic(50, teams, seed=3) == synthetic(50, teams, seed=3)
    assert synthetic(50, teams, seed=3) != synthetic(50, teams, seed=4)


# -- the event loop ---------------------------------------------------------------------


def test_a_single_job_runs_for_its_duration():
    res = simulate([TraceJob("j", "t", 10.0, 100.0, 2)], shared_cluster(1), "fifo")
    (r,) = res.jobs
    assert (r.first_start, r.finish) == (10.0, 110.0)
    rep = summarise(res)
    assert rep.avg_jct == 100.0 and rep.avg_delay == 0.0 and rep.makespan == 100.0


def test_jobs_queue_fifo_on_a_full_cluster():
    jobs = [TraceJob(f"j{i}", "t", float(i), 100.0, 8) for i in range(3)]
    res = simulate(jobs, shared_cluster(1), "fifo")
    assert [r.finish for r in res.jobs] == [100.0, 200.0, 300.0]


@pytest.mark.parametrize("policy", ["fifo", "backfill", "fair"])
def test_gangs_beyond_the_queue_depth_start_when_there_is_room(policy):
    """Issue 17 (1): 40 one-GPU jobs at t=0 on 64 free GPUs; the policy sees 32 a cycle,
    and the other 8 used to wait for an unrelated event (here: t=1000)."""
    jobs = [TraceJob(f"j{i:02d}", "t", 0.0, 1000.0, 1) for i in range(40)]
    res = simulate(jobs, shared_cluster(8), policy, SimConfig(queue_depth=32))
    assert [r.first_start for r in res.jobs] == [0.0] * 40
    assert summarise(res).avg_jct == 1000.0


def test_reclaim_preempts_and_charges_checkpoint_and_restore_cost():
    # a borrows the whole 8-GPU node at t=0; b (guarantee 4) arrives at t=1000.
    cluster = SimCluster(build_nodes(1), (Quota("a", "default", 4), Quota("b", "default", 4)))
    jobs = [TraceJob("a1", "a", 0.0, 5000.0, 8), TraceJob("b1", "b", 1000.0, 100.0, 4)]
    cfg = SimConfig(checkpoint_every_s=300.0, restore_s=60.0)
    res = simulate(jobs, cluster, "fair", cfg)
    a1, b1 = res.jobs
    assert a1.preemptions == 1 and b1.first_start == 1000.0 and b1.finish == 1100.0
    # a1 keeps 900 s (checkpoints at 300, 600, 900), loses 100 s x 8 GPUs, restarts at
    # 1100 when b1 ends, then runs 4100 s + 60 s restore.
    assert a1.lost_gpu_s == 800.0
    assert a1.finish == 1100.0 + 4100.0 + 60.0
    assert summarise(res).preemptions == 1
    assert simulate(jobs, cluster, "fifo", cfg).jobs[0].preemptions == 0


def test_each_checkpoint_write_stalls_the_job():
    """Issue 17: a checkpoint was free to write. Every 300 s, 30 s of writing (the
    checkpoint ends at 300, 600, 900): 1,000 s of work take 1,090 s."""
    cfg = SimConfig(checkpoint_every_s=300.0, restore_s=60.0, checkpoint_write_s=30.0)
    res = simulate([TraceJob("j", "t", 0.0, 1000.0, 1)], shared_cluster(1), "fifo", cfg)
    assert res.jobs[0].finish == 1090.0
    # one that ends before its first write begins pays nothing
    res = simulate([TraceJob("j", "t", 0.0, 270.0, 1)], shared_cluster(1), "fifo", cfg)
    assert res.jobs[0].finish == 270.0


def test_a_preempted_job_keeps_its_work_less_the_writes_and_pays_them_again():
    """The reclaim case above with 30 s writes: at 1,000 s a1's last checkpoint (ending at
    900 s) holds 900 - 3 x 30 = 810 s of work; it loses 190 s x 8 GPUs; its second
    attempt (from 1,100 s) runs a 60 s restore and 4,190 s of work with 15 writes."""
    cluster = SimCluster(build_nodes(1), (Quota("a", "default", 4), Quota("b", "default", 4)))
    jobs = [TraceJob("a1", "a", 0.0, 5000.0, 8), TraceJob("b1", "b", 1000.0, 100.0, 4)]
    cfg = SimConfig(checkpoint_every_s=300.0, restore_s=60.0, checkpoint_write_s=30.0)
    a1, b1 = simulate(jobs, cluster, "fair", cfg).jobs
    assert b1.finish == 1100.0
    assert a1.lost_gpu_s == 190.0 * 8
    assert a1.finish == 1100.0 + 60.0 + 4190.0 + 15 * 30.0


def test_a_checkpoint_write_longer_than_its_interval_is_refused():
    with pytest.raises(ValueError, match="checkpoint_write_s"):
        SimConfig(checkpoint_every_s=60.0, checkpoint_write_s=60.0)


def test_a_job_larger_than_the_cluster_is_rejected_not_waited_for():
    res = simulate([TraceJob("j", "t", 0.0, 10.0, 64)], shared_cluster(2), "fair")
    rep = summarise(res)
    assert rep.rejected == 1 and rep.unfinished == 0 and "could never fit" in res.jobs[0].rejected


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    policy=st.sampled_from(["fifo", "backfill", "fair"]),
    n=st.integers(1, 60),
)
def test_every_job_of_a_finite_trace_finishes(seed, policy, n):
    teams = {"a": 2, "b": 2, "c": 2}
    jobs = synthetic(
        n,
        {t: 1.0 for t in teams},
        seed=seed,
        mean_interarrival=30.0,
        median_duration=300.0,
    )
    cluster = team_cluster(teams, 1.0, nodes_per_rack=2)
    res = simulate(
        jobs,
        cluster,
        policy,
        SimConfig(runtime_limit_factor=1.5, checkpoint_every_s=120.0),
    )
    assert res.unfinished == 0
    for r in res.jobs:
        assert r.rejected is None  # every synthetic gang (<= 16 GPUs) fits every partition
        assert r.first_start >= r.job.submit
        assert r.finish - r.first_start >= r.job.duration - 1e-6
    rep = summarise(res)
    assert rep.finished == n and 0 < rep.utilisation <= 1.0 + 1e-9
    assert (
        summarise(
            simulate(
                jobs,
                cluster,
                policy,
                SimConfig(runtime_limit_factor=1.5, checkpoint_every_s=120.0),
            )
        )
        == rep
    )


def test_fair_beats_fifo_on_average_jct_when_partitions_are_unbalanced():
    jobs = synthetic(300, {"busy": 10.0, "idle": 0.2}, seed=7, mean_interarrival=20.0)
    cluster = team_cluster({"busy": 2, "idle": 2}, 1.0)
    fifo = summarise(simulate(jobs, cluster, "fifo"))
    fair = summarise(simulate(jobs, cluster, "fair"))
    assert fair.finished == fifo.finished == 300
    assert fair.avg_jct < 0.8 * fifo.avg_jct
    assert fair.team_share["busy"][0] > 0.5


def test_percentile_nearest_rank():
    assert percentile([], 99) == 0.0
    assert percentile([5.0], 50) == 5.0
    values = [float(i) for i in range(1, 101)]
    assert percentile(values, 50) == 50.0 and percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0


def test_held_while_queued_shows_who_had_its_guarantee():
    jobs = synthetic(200, {"busy": 10.0, "idle": 0.2}, seed=7, mean_interarrival=20.0)
    cluster = team_cluster({"busy": 2, "idle": 2}, 1.0)
    fifo = summarise(simulate(jobs, cluster, "fifo"))
    fair = summarise(simulate(jobs, cluster, "fair"))
    assert fifo.held_while_queued["busy"] <= 1.0 + 1e-9  # never above its guarantee
    assert fair.held_while_queued["busy"] > 1.2  # it borrowed the idle team's GPUs


def test_fairness_across_teams_and_jains_index():
    from aicluster.sim.report import fairness

    f = fairness({"a": 1.0, "b": 1.5, "c": 1.0, "d": 1.0})
    assert (f.min, f.median, f.jain) == (1.0, 1.0, 1.0), "borrowing above is no unfairness"
    f = fairness({"a": 1.0, "b": 0.0, "c": 0.0, "d": 0.0})
    assert (f.min, f.jain) == (0.0, 0.25)  # one team of four had its guarantee: 1/n
    f = fairness({t: x for t, x in zip("abcdefghij", [0.36] + [1.0] * 9, strict=True)})
    assert f.min == f.p10 == 0.36 and f.median == 1.0 and 0.9 < f.jain < 1.0
    assert fairness({}) is None
