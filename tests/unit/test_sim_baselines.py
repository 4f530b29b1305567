"""The benchmark's extra baselines (issue 17): drawn user estimates, 2D-LAS, oracle SRTF."""

from __future__ import annotations

from dataclasses import replace

import pytest

from aicluster.core.model import (
    Admit,
    GangRequest,
    Preempt,
    Res,
    RunningWorkload,
    Snapshot,
    Wait,
    WaitKind,
)
from aicluster.core.policies.las import LasPolicy
from aicluster.core.scheduler import POLICY_NAMES
from aicluster.sim import SimConfig, TraceJob, shared_cluster, simulate, synthetic
from aicluster.sim.cluster import build_nodes
from aicluster.sim.estimates import estimate_factor
from aicluster.sim.oracle import SrtfOracle

H = 3600.0


def gang(wid: str, gpus: int, submitted: float = 0.0, attained: float = 0.0) -> GangRequest:
    return GangRequest(
        wid, "t", 1, Res(1.0, 0, gpus), submitted_at=submitted, attained_service=attained
    )


def one_node_with(running: list[RunningWorkload], pending: list[GangRequest]) -> Snapshot:
    (node,) = build_nodes(1, 8)
    used = sum(r.gang.total.gpus for r in running)
    cpus = sum(r.gang.total.cpus for r in running)
    node = replace(node, allocated=Res(cpus, 0, used))
    return Snapshot((node,), tuple(pending), tuple(running))


# -- user runtime estimates ----------------------------------------------------------


def test_estimates_are_seeded_per_job_and_within_1_and_f():
    factors = [estimate_factor(f"p{i:07d}", 10.0, seed=3) for i in range(2000)]
    assert all(1.0 <= u <= 10.0 for u in factors)
    assert factors == [estimate_factor(f"p{i:07d}", 10.0, seed=3) for i in range(2000)]
    assert factors != [estimate_factor(f"p{i:07d}", 10.0, seed=4) for i in range(2000)]
    assert 5.0 < sum(factors) / len(factors) < 6.0  # uniform: mean (1 + f) / 2
    assert min(factors) < 1.5 and max(factors) > 9.5
    assert estimate_factor("j", 1.0) == 1.0


def test_the_simulator_gives_each_job_its_drawn_limit():
    jobs = [TraceJob(f"j{i}", "t", float(i), 100.0 + i, 1) for i in range(20)]
    res = simulate(jobs, shared_cluster(4), "backfill", SimConfig(estimate_f=4.0))
    for rec in res.jobs:
        u = estimate_factor(rec.job.job_id, 4.0)
        assert rec.gang.runtime_limit == pytest.approx(rec.job.duration * u)
        assert rec.job.duration <= rec.gang.runtime_limit <= 4.0 * rec.job.duration
    plain = simulate(jobs, shared_cluster(4), "backfill", SimConfig(runtime_limit_factor=2.0))
    assert {r.gang.runtime_limit for r in plain.jobs} == {2.0 * j.duration for j in jobs}


# -- 2D-LAS --------------------------------------------------------------------------


def test_las_demotes_a_long_job_below_a_new_one_and_preempts_it():
    """An 8-GPU job that has run 2 h (16 GPU-h: the lowest queue) holds the node; a new
    1-GPU job (queue 0) preempts it."""
    long = RunningWorkload(gang("long", 8), ("n0000",), started_at=0.0, pool="default")
    new = gang("new", 1, submitted=2 * H)
    decisions = LasPolicy().plan(one_node_with([long], [new]), 2 * H)
    assert decisions[0] == Preempt("long", decisions[0].reason)
    assert decisions[1] == Wait("new", decisions[1].reason, WaitKind.PREEMPTING)
    policy = LasPolicy()
    assert policy.running_queue(long, 2 * H) == 2
    assert policy.pending_queue(new, 2 * H) == 0
    # the same job in the same queue as the newcomer is not preempted
    young = RunningWorkload(gang("young", 8), ("n0000",), started_at=2 * H - 60, pool="default")
    (d,) = LasPolicy().plan(one_node_with([young], [new]), 2 * H)
    assert isinstance(d, Wait) and d.kind is not WaitKind.PREEMPTING


def test_las_orders_by_queue_then_arrival():
    demoted = gang("demoted", 8, submitted=0.0, attained=20 * H)  # queue 2, came first
    fresh = gang("fresh", 8, submitted=10.0)
    policy = LasPolicy(promote_knob=None)
    decisions = policy.plan(one_node_with([], [demoted, fresh]), 11.0)
    assert Admit("fresh", ("n0000",)) in decisions
    assert isinstance(next(d for d in decisions if d.workload_id == "demoted"), Wait)


def test_las_starvation_guard_promotes_a_job_that_waited_promote_knob_times_its_run():
    # ran 2.5 h on 8 GPUs (20 GPU-h: queue 2); submitted at 0
    demoted = gang("demoted", 8, submitted=0.0, attained=20 * H)
    policy = LasPolicy(promote_knob=4.0)
    ran = 2.5 * H
    assert policy.pending_queue(demoted, ran + 4 * ran - 1) == 2  # waited just under 4 x
    assert policy.pending_queue(demoted, ran + 4 * ran) == 0  # promoted to queue 0
    fresh = gang("fresh", 8, submitted=ran + 4 * ran - 10)
    clock = ran + 4 * ran
    decisions = policy.plan(one_node_with([], [demoted, fresh]), clock)
    assert Admit("demoted", ("n0000",)) in decisions  # queue 0 too, and it came first
    # once promoted and running, it is not preempted at once by a new queue-0 job
    run = RunningWorkload(demoted, ("n0000",), started_at=clock, pool="default")
    assert policy.running_queue(run, clock + 60) == 0
    assert policy.running_queue(run, clock + 10 * H) == 0  # for the whole attempt
    (d,) = policy.plan(one_node_with([run], [fresh]), clock + 60)
    assert isinstance(d, Wait) and d.kind is not WaitKind.PREEMPTING
    # without the knob it would have stayed below the fresh job
    assert LasPolicy(promote_knob=None).pending_queue(demoted, clock) == 2


def test_las_is_not_a_live_policy():
    """It needs attained service the control plane does not record (see its docstring)."""
    assert "las" not in POLICY_NAMES and "srtf-oracle" not in POLICY_NAMES


# -- oracle SRTF ---------------------------------------------------------------------


def test_srtf_runs_the_shortest_first():
    jobs = [
        TraceJob("a-long", "t", 0.0, 1000.0, 8),
        TraceJob("b-mid", "t", 0.0, 500.0, 8),
        TraceJob("c-short", "t", 0.0, 100.0, 8),
    ]
    res = simulate(jobs, shared_cluster(1), SrtfOracle(), SimConfig())
    starts = {r.job.job_id: r.first_start for r in res.jobs}
    assert starts == {"c-short": 0.0, "b-mid": 100.0, "a-long": 600.0}
    assert sum(r.preemptions for r in res.jobs) == 0


def test_srtf_preempts_a_long_job_for_a_short_arrival():
    jobs = [TraceJob("long", "t", 0.0, 10 * H, 8), TraceJob("short", "t", H, 600.0, 4)]
    res = simulate(jobs, shared_cluster(1), SrtfOracle(), SimConfig(checkpoint_every_s=1800.0))
    by = {r.job.job_id: r for r in res.jobs}
    assert by["short"].first_start == H and by["short"].finish == H + 600.0
    assert by["long"].preemptions == 1
    # resumed from its last checkpoint (at 1 h: nothing lost) after the short job
    assert by["long"].finish == pytest.approx(10 * H + 600.0 + 60.0)


def test_srtf_without_the_simulator_refuses_to_plan():
    with pytest.raises(RuntimeError):
        SrtfOracle().plan(one_node_with([], [gang("g", 1)]), 0.0)


# -- whole traces --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "cfg"),
    [
        ("backfill", SimConfig(estimate_f=10.0)),
        (LasPolicy(), SimConfig()),
        (SrtfOracle(), SimConfig()),
        (LasPolicy(promote_knob=1.0), SimConfig(queue_depth=1 << 30)),
        (SrtfOracle(), SimConfig(queue_depth=1 << 30)),
    ],
)
def test_every_job_of_a_synthetic_trace_finishes(policy, cfg):
    jobs = synthetic(200, {"a": 1.0, "b": 2.0}, seed=7, mean_interarrival=120.0)
    res = simulate(jobs, shared_cluster(4), policy, cfg)
    assert res.unfinished == 0
    assert all(r.finish is not None or r.rejected for r in res.jobs)
    assert sum(1 for r in res.jobs if r.rejected) == sum(1 for j in jobs if j.gpus > 32)
    for r in res.jobs:
        if r.finish is not None:
            assert r.finish - r.first_start >= r.job.duration - 1e-6


def test_las_ranks_running_gangs_as_its_queue_and_work_lost_say_whatever_it_kept():
    """`LasPolicy._ranked_running` computes each gang's queue and work lost from what it
    keeps per running gang; its order must stay the one `running_queue` and
    `RunningWorkload.work_lost` give, at every clock, also when the same objects come
    again (the simulator's reuse) and when they are new."""
    import random

    rnd = random.Random(7)
    policy = LasPolicy()
    runs = []
    for i in range(60):
        g = replace(
            gang(f"r{i:02d}", rnd.choice([1, 2, 4, 8]), submitted=rnd.uniform(0, 5 * H)),
            attained_service=rnd.choice([0.0, 0.5 * H, 4 * H, 40 * H]),
            priority=rnd.choice([0, 0, 1]),
            preemptible=rnd.random() > 0.1,
        )
        extra = rnd.choice(
            [{}, {"checkpoint_every_s": 900.0}, {"last_checkpoint_at": 6 * H + 100.0}]
        )
        runs.append(RunningWorkload(g, ("n0",), 6 * H + rnd.uniform(0, 2 * H), **extra))
    for clock in (6 * H, 7 * H, 9 * H, 30 * H):
        expected = sorted(
            (
                r.gang.priority,
                -policy.running_queue(r, clock),
                r.work_lost(clock),
                -r.gang.submitted_at,
                r.workload_id,
            )
            for r in runs
            if r.gang.preemptible and r.started_at < clock
        )
        for same in (tuple(runs), tuple(replace(r) for r in runs)):
            ranked, prefixes = policy._ranked_running(same, clock)
            assert [e[:5] for e in ranked] == expected
            assert prefixes == [e[:2] for e in expected]
    assert expected and len({e[1] for e in expected}) > 1  # the queues differ: it is tested
