"""Property tests (hypothesis) of core.scheduler.plan_cycle over random clusters and queues.

For every policy: no node gets more than it holds; no team goes past its guarantee +
borrowing limit (strict partitions: past its guarantee); gangs are placed whole, in one
pool, on nodes of their GPU model; every pending gang gets exactly one decision;
decisions are deterministic and independent of input order. For `fair` with
preemption: a team under its guarantee with pending work gets it within one cycle
(the cycle that preempts, then the one that admits), and the gang it preempted for
is admitted in the next cycle.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aicluster.core.model import Admit, Preempt, Snapshot, Wait
from aicluster.core.scheduler import POLICY_NAMES, get_policy, plan_cycle

from builders import gang, node
from sched_helpers import apply, q

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TEAMS = ["a", "b", "c"]


@st.composite
def clusters(draw, one_gpu_gangs: bool = False):
    """A snapshot reached by running `fair` from an empty cluster, plus new pending work."""
    n = draw(st.integers(1, 5))
    nodes = [
        replace(
            node(
                f"n{i}",
                gpus=draw(st.sampled_from([2, 4, 8])),
                cpus=32,
                gpu_model=None if one_gpu_gangs else draw(st.sampled_from([None, "A100"])),
                pool="default"
                if one_gpu_gangs
                else draw(st.sampled_from(["default", "default", "p2"])),
            ),
            rack=f"r{draw(st.integers(0, 1))}",
        )
        for i in range(n)
    ]
    total = sum(x.capacity.gpus for x in nodes if x.pool == "default")
    quotas = []
    left = total
    for t in TEAMS[: draw(st.integers(0, 3))]:
        g = draw(st.integers(0, left))
        left -= g
        borrow = draw(st.sampled_from([None, 0, 2, 8]))
        quotas.append(q(t, g, borrow_gpus=borrow))

    def gangs(prefix, k, t0):
        out = []
        for j in range(k):
            workers = 1 if one_gpu_gangs else draw(st.integers(1, 3))
            gpus = 1 if one_gpu_gangs else draw(st.sampled_from([1, 2, 4, 8]))
            out.append(
                replace(
                    gang(
                        f"{prefix}{j}",
                        team=draw(st.sampled_from(TEAMS)),
                        workers=workers,
                        gpus=gpus,
                        priority=draw(st.sampled_from([0, 0, 1])),
                        submitted_at=t0 + j,
                        gpu_model=None
                        if one_gpu_gangs
                        else draw(st.sampled_from([None, None, "a100"])),
                    ),
                    locality=draw(st.sampled_from(["pool", "pool", "rack"])),
                )
            )
        return out

    n_old = draw(st.integers(4, 30) if one_gpu_gangs else st.integers(0, 10))  # fill it up
    start = Snapshot(tuple(nodes), tuple(gangs("old", n_old, 0.0)), (), tuple(quotas))
    state = apply(start, plan_cycle(start, 0.0, "fair"), 0.0)
    state = replace(state, pending=tuple(gangs("new", draw(st.integers(0, 8)), 100.0)))
    return state


def _usage(snap: Snapshot, decisions) -> dict[str, int]:
    """GPUs per team in pool default after the decisions (preempted gone, admitted in)."""
    gone = {d.workload_id for d in decisions if isinstance(d, Preempt)}
    pool = {x.node_id: x.pool for x in snap.nodes}
    use: Counter = Counter()
    for r in snap.running:
        if r.workload_id not in gone and r.pool == "default":
            use[r.gang.team] += r.gang.total.gpus
    gangs = {g.workload_id: g for g in snap.pending}
    for d in decisions:
        if isinstance(d, Admit) and pool[d.placement[0]] == "default":
            use[gangs[d.workload_id].team] += gangs[d.workload_id].total.gpus
    return use


@SETTINGS
@given(snap=clusters(), policy=st.sampled_from(POLICY_NAMES))
def test_capacity_gangs_and_decision_coverage(snap, policy):
    decisions = plan_cycle(snap, 120.0, policy)
    nodes = {x.node_id: x for x in snap.nodes}
    gangs = {g.workload_id: g for g in snap.pending}
    running = {r.workload_id: r for r in snap.running}
    # exactly one Admit or Wait per pending gang; Preempts only of running preemptible work
    decided = [d.workload_id for d in decisions if not isinstance(d, Preempt)]
    assert sorted(decided) == sorted(gangs)
    for d in decisions:
        if isinstance(d, Preempt):
            assert running[d.workload_id].gang.preemptible
    # capacity: admitted work fits what was free (preempted room is not reused this cycle)
    used = defaultdict(lambda: [0.0, 0, 0])
    for d in decisions:
        if isinstance(d, Admit):
            g = gangs[d.workload_id]
            assert len(d.placement) == g.workers  # all or nothing
            assert len({nodes[x].pool for x in d.placement}) == 1  # one pool
            if g.locality == "rack":
                assert len({nodes[x].rack for x in d.placement}) == 1
            for x in d.placement:
                assert g.gpu_model is None or nodes[x].gpu_model == "A100"
                used[x][0] += g.per_worker.cpus
                used[x][2] += g.per_worker.gpus
    for x, (cpus, _, gpus) in used.items():
        assert gpus <= nodes[x].free.gpus and cpus <= nodes[x].free.cpus + 1e-9


@SETTINGS
@given(snap=clusters(), policy=st.sampled_from(POLICY_NAMES))
def test_never_past_guarantee_plus_borrowing_limit(snap, policy):
    decisions = plan_cycle(snap, 120.0, policy)
    before, after = _usage(snap, []), _usage(snap, decisions)
    for quota in snap.quotas:
        ceiling = (
            quota.gpus
            if policy != "fair"
            else quota.gpus + (quota.borrow_gpus if quota.borrow_gpus is not None else 10**9)
        )
        # a team only grows up to its ceiling (it may already be above it if borrowed before)
        assert after[quota.team] <= max(ceiling, before[quota.team]), (
            quota,
            before,
            after,
        )


@SETTINGS
@given(snap=clusters(), policy=st.sampled_from(POLICY_NAMES), seed=st.integers(0, 1000))
def test_deterministic_and_independent_of_input_order(snap, policy, seed):
    first = plan_cycle(snap, 120.0, policy)
    rng = random.Random(seed)
    shuffled = [
        list(snap.nodes),
        list(snap.pending),
        list(snap.running),
        list(snap.quotas),
    ]
    for part in shuffled:
        rng.shuffle(part)
    again = Snapshot(*map(tuple, shuffled))
    assert plan_cycle(again, 120.0, policy) == first
    # a policy object reused across cycles keeps caches that never change a decision
    # (`fair`'s reservations are decisions kept on purpose: forgotten between the plans)
    reused = get_policy(policy)
    reused.plan(replace(snap, pending=snap.pending[:1]), 50.0)
    _forget_reservations(reused)
    assert reused.plan(snap, 120.0) == first
    _forget_reservations(reused)
    assert reused.plan(again, 120.0) == first


def _forget_reservations(policy) -> None:
    """Drop the room `fair` kept for gangs it preempted for (tests/unit/test_sched_reservations)."""
    getattr(policy, "reservations", {}).clear()


@SETTINGS
@given(snap=clusters(one_gpu_gangs=True))
def test_team_under_guarantee_gets_it_within_one_cycle(snap):
    owed = {}
    use = _usage(snap, [])
    for quota in snap.quotas:
        waiting = [g for g in snap.pending if g.team == quota.team]
        if waiting and use[quota.team] + 1 <= quota.gpus:
            owed[quota.team] = use[quota.team]
    first = plan_cycle(snap, 120.0, "fair")
    nxt = apply(snap, first, 120.0)
    second = plan_cycle(nxt, 121.0, "fair")
    assert not [
        d
        for d in second
        if isinstance(d, Preempt)
        and d.workload_id in {a.workload_id for a in first if isinstance(a, Admit)}
    ]
    final = _usage(nxt, second)
    for team, had in owed.items():
        assert final[team] > had, (team, had, final, first, second)


@SETTINGS
@given(snap=clusters())
def test_fair_admits_the_gang_it_preempted_for_in_the_next_cycle(snap):
    """One policy object across both cycles (as the control plane keeps it): the room a
    gang preempted for is kept for it (`fair`'s reservations), whatever else is queued."""
    policy = get_policy("fair")
    first = plan_cycle(snap, 120.0, policy)
    preempting = {d.workload_id for d in first if isinstance(d, Wait) and d.kind == "preempting"}
    second = plan_cycle(apply(snap, first, 120.0), 121.0, policy)
    assert preempting <= {d.workload_id for d in second if isinstance(d, Admit)}
    assert all(r.since == 121.0 for r in policy.reservations.values())  # only new ones left


@SETTINGS
@given(snap=clusters())
def test_fair_without_waits_leaves_no_gpu_idle_that_a_waiting_gang_could_use(snap):
    # Work conservation on single-GPU, single-worker gangs without locality or model.
    decisions = plan_cycle(snap, 120.0, "fair")
    nxt = apply(snap, decisions, 120.0)
    if any(isinstance(d, Preempt) for d in decisions):
        return
    free = sum(max(0, x.free.gpus) for x in nxt.nodes if x.pool == "default")
    for d in decisions:
        g = {g.workload_id: g for g in snap.pending}[d.workload_id]
        if isinstance(d, Wait) and (
            g.workers,
            g.per_worker.gpus,
            g.gpu_model,
            g.pool,
        ) == (1, 1, None, None):
            team_quota = next((x for x in snap.quotas if x.team == g.team), None)
            if team_quota is None or team_quota.borrow_gpus is None:
                assert free == 0 or "quota" in d.reason or "cohort" in d.reason, d
