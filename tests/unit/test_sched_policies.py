"""The three policies (fifo, backfill, fair) on small hand-made cases."""

from __future__ import annotations

from dataclasses import replace

import pytest

from aicluster.core.model import Admit, Preempt, Wait, WaitKind
from aicluster.core.policies.fair import FairPolicy
from aicluster.core.scheduler import get_policy, plan_cycle

from builders import admits, by_id, gang, node
from sched_helpers import apply, q, qsnap, running

H = 3600.0


def preempts(decisions):
    return [d for d in decisions if isinstance(d, Preempt)]


# -- fifo ----------------------------------------------------------------------------


def test_fifo_does_not_borrow_idle_quota():
    snap = qsnap(
        [node("n", gpus=16)],
        [gang("a1", team="a", gpus=8), gang("a2", team="a", gpus=1)],
        quotas=[q("a", 8), q("b", 8)],
    )
    d = by_id(plan_cycle(snap, 0.0, "fifo"))
    assert d["a1"] == Admit("a1", ("n",))
    assert d["a2"].reason.startswith("quota of team a exhausted in pool default")
    assert d["a2"].kind is WaitKind.QUOTA


def test_fifo_head_blocks_only_its_own_partition():
    snap = qsnap(
        [node("n", gpus=16)],
        [
            gang("a1", team="a", gpus=8, submitted_at=0),
            gang("a2", team="a", gpus=2, submitted_at=1),
            gang("a3", team="a", gpus=1, submitted_at=2),
            gang("b1", team="b", gpus=2, submitted_at=3),
        ],
        running=[running(gang("ra", team="a", gpus=4), ["n"])],
        quotas=[q("a", 8), q("b", 8)],
    )
    d = by_id(plan_cycle(snap, 0.0, "fifo"))
    assert isinstance(d["a1"], Wait) and "quota of team a" in d["a1"].reason
    assert d["a2"] == Wait("a2", "queued behind a1", WaitKind.QUEUED_BEHIND)
    assert d["a3"] == Wait("a3", "queued behind a1", WaitKind.QUEUED_BEHIND)
    assert isinstance(d["b1"], Admit)


def test_fifo_gang_larger_than_its_partition_could_never_fit():
    snap = qsnap(
        [node("n", gpus=16)],
        [gang("a", team="a", gpus=9)],
        quotas=[q("a", 8), q("b", 8)],
    )
    (d,) = plan_cycle(snap, 0.0, "fifo")
    assert d.never_fits and "partition" in d.reason
    assert d.kind is WaitKind.NEVER_FITS


def test_without_quotas_fifo_is_one_fcfs_queue_per_pool():
    snap = qsnap(
        [node("n", gpus=8, used_gpus=6)],
        [
            gang("big", team="x", gpus=4, submitted_at=0),
            gang("small", team="y", gpus=1, submitted_at=1),
        ],
    )
    d = by_id(plan_cycle(snap, 0.0, "fifo"))
    assert isinstance(d["big"], Wait) and d["big"].kind is WaitKind.CAPACITY
    assert d["small"] == Wait("small", "queued behind big", WaitKind.QUEUED_BEHIND)


def test_unknown_policy_is_a_clear_error():
    with pytest.raises(ValueError, match="choose one of fifo, backfill, fair"):
        get_policy("lottery")


# -- backfill ------------------------------------------------------------------------


def _backfill_case(short_limit):
    # Head needs the whole 8-GPU node; a 4-GPU job runs until t=100 (its limit).
    r = running(replace(gang("r", gpus=4), runtime_limit=100.0), ["n"], started_at=0.0)
    head = gang("head", gpus=8, submitted_at=0.0)
    later = replace(gang("later", gpus=2, submitted_at=1.0), runtime_limit=short_limit)
    return qsnap([node("n", gpus=8)], [head, later], running=[r])


def test_backfill_starts_a_job_that_ends_before_the_shadow_time():
    d = by_id(plan_cycle(_backfill_case(50.0), 10.0, "backfill"))
    assert isinstance(d["head"], Wait) and isinstance(d["later"], Admit)
    assert isinstance(by_id(plan_cycle(_backfill_case(50.0), 10.0, "fifo"))["later"], Wait)


def test_backfill_refuses_a_job_that_would_delay_the_head():
    d = by_id(plan_cycle(_backfill_case(500.0), 10.0, "backfill"))
    assert isinstance(d["later"], Wait) and "would delay" in d["later"].reason
    assert d["later"].kind is WaitKind.QUEUED_BEHIND  # the head waits for the shared GPUs
    d = by_id(plan_cycle(_backfill_case(None), 10.0, "backfill"))
    assert isinstance(d["later"], Wait)


def test_backfill_without_limits_uses_nodes_the_head_does_not_need():
    r = running(gang("r", gpus=4), ["a"])
    snap = qsnap(
        [node("a", gpus=8), node("b", gpus=4)],
        [gang("head", gpus=8, submitted_at=0), gang("later", gpus=4, submitted_at=1)],
        running=[r],
    )
    d = by_id(plan_cycle(snap, 0.0, "backfill"))
    assert d["later"] == Admit("later", ("b",))


def test_backfill_without_limits_never_starts_a_gang_ahead_of_a_quota_blocked_head():
    """Issue 17 (2): without runtime limits the quota hold's shadow time is infinite, and
    `end > time` (INF > INF) was False, so every smaller gang of the team started ahead of
    its quota-blocked head, forever (Philly: 32-GPU gangs started 78 days late)."""
    snap = qsnap(
        [node("n", gpus=16)],
        [gang("head", team="a", gpus=8, submitted_at=0), gang("small", team="a", gpus=2)],
        running=[running(gang("ra", team="a", gpus=4), ["n"])],
        quotas=[q("a", 8), q("b", 8)],
    )
    d = by_id(plan_cycle(snap, 10.0, "backfill"))
    assert isinstance(d["head"], Wait) and d["head"].kind is WaitKind.QUOTA
    assert isinstance(d["small"], Wait) and d["small"].kind is WaitKind.QUEUED_BEHIND
    # With limits, a gang that ends before the running work frees the quota may go first.
    limited = replace(gang("ra", team="a", gpus=4), runtime_limit=100.0)
    short = replace(gang("small", team="a", gpus=2), runtime_limit=50.0)
    snap = qsnap(
        [node("n", gpus=16)],
        [gang("head", team="a", gpus=8, submitted_at=0), short],
        running=[running(limited, ["n"])],
        quotas=[q("a", 8), q("b", 8)],
    )
    assert isinstance(by_id(plan_cycle(snap, 10.0, "backfill"))["small"], Admit)


# -- fair: borrowing and fair share --------------------------------------------------


def test_fair_borrows_idle_quota_of_the_cohort():
    snap = qsnap(
        [node("n", gpus=16)],
        [gang("a1", team="a", workers=12, gpus=1)],
        quotas=[q("a", 8), q("b", 8)],
    )
    (d,) = plan_cycle(snap, 0.0, "fair")
    assert isinstance(d, Admit)


def test_fair_respects_the_borrowing_limit():
    snap = qsnap(
        [node("n", gpus=16)],
        [gang("a1", team="a", workers=12, gpus=1)],
        quotas=[q("a", 8, borrow_gpus=2), q("b", 8)],
    )
    (d,) = plan_cycle(snap, 0.0, "fair")
    assert d.never_fits and "at most 10" in d.reason


def test_fair_guarantee_first_then_smallest_borrowed_share():
    # a already borrows 4; b and c borrow nothing yet: c and b get the idle GPUs first.
    r = running(gang("ra", team="a", gpus=8), ["n1"])
    pending = [gang(f"a{i}", team="a", gpus=1, submitted_at=i) for i in range(4)]
    pending += [gang(f"b{i}", team="b", gpus=1, submitted_at=10 + i) for i in range(4)]
    snap = qsnap(
        [node("n1", gpus=8), node("n2", gpus=4)],
        pending,
        running=[r],
        quotas=[q("a", 4), q("b", 2), q("c", 6)],
    )
    got = admits(plan_cycle(snap, 0.0, "fair"))
    # b0, b1 within b's guarantee; then b borrows (share 0, then 1/12) before a (4/12)
    assert sorted(got) == ["b0", "b1", "b2", "b3"]


def test_fair_priority_orders_within_a_team():
    snap = qsnap(
        [node("n", gpus=1)],
        [gang("low", gpus=1, submitted_at=0), gang("high", gpus=1, priority=5, submitted_at=9)],
    )
    assert admits(plan_cycle(snap, 0.0, "fair")) == {"high": ("n",)}


def test_fair_least_attained_service_goes_first():
    old = replace(gang("resumed", gpus=1, submitted_at=0), attained_service=100 * H)
    snap = qsnap([node("n", gpus=1)], [old, gang("new", gpus=1, submitted_at=5)])
    assert admits(plan_cycle(snap, 10.0, "fair")) == {"new": ("n",)}


def test_fair_skips_a_gang_that_does_not_fit():
    snap = qsnap(
        [node("n", gpus=4)],
        [gang("big", gpus=8, submitted_at=0), gang("s", gpus=2, submitted_at=1)],
        running=[running(gang("r", gpus=1), ["n"])],
    )
    snap = replace(snap, nodes=snap.nodes + (node("m", gpus=8, used_gpus=1),))
    d = by_id(plan_cycle(snap, 0.0, "fair"))
    assert isinstance(d["big"], Wait) and isinstance(d["s"], Admit)


# -- fair: preemption ------------------------------------------------------------------


def _reclaim_case(**kw):
    # a borrows the whole cluster; b (guarantee 8) submits 4 GPUs of work.
    runs = [
        running(gang(f"a{i}", team="a", gpus=2), [f"n{i // 4}"], started_at=float(i), **kw)
        for i in range(8)
    ]
    return qsnap(
        [node("n0", gpus=8), node("n1", gpus=8)],
        [gang("b1", team="b", gpus=4, submitted_at=20)],
        running=runs,
        quotas=[q("a", 8), q("b", 8)],
    )


def test_backfill_holds_a_later_gang_off_the_reserved_nodes():
    # The head is within its team's quota but waits for room: a reservation, not a queue.
    r = running(replace(gang("r", team="o", gpus=4), runtime_limit=100.0), ["n"], started_at=0.0)
    head = gang("head", team="t", gpus=8, submitted_at=0.0)
    later = replace(gang("later", team="t", gpus=2, submitted_at=1.0), runtime_limit=500.0)
    snap = qsnap([node("n", gpus=8)], [head, later], quotas=[q("t", 8)], running=[r])
    d = by_id(plan_cycle(snap, 10.0, "backfill"))
    assert d["head"].kind is WaitKind.CAPACITY
    assert d["later"].kind is WaitKind.BACKFILL_RESERVATION
    assert d["later"].reason == "waiting: starting now would delay head"


def test_fair_reclaims_a_guarantee_by_preempting_borrowed_work_then_admits():
    snap = _reclaim_case()
    decisions = plan_cycle(snap, 30.0, "fair")
    victims = preempts(decisions)
    assert len(victims) == 2 and all("team a borrows" in p.reason for p in victims)
    assert decisions[: len(victims)] == victims  # preemptions come first
    assert "preempting 2 workload(s)" in by_id(decisions)["b1"].reason
    assert by_id(decisions)["b1"].kind is WaitKind.PREEMPTING
    nxt = apply(snap, decisions, 30.0)
    again = plan_cycle(nxt, 31.0, "fair")
    assert isinstance(by_id(again)["b1"], Admit) and not preempts(again)


def test_fair_victims_least_work_lost_since_checkpoint_first():
    snap = _reclaim_case(checkpoint_every_s=4.0)
    snap = replace(snap, pending=(gang("b1", team="b", gpus=2, submitted_at=20),))
    # at t=30: a_i started at i, checkpoints every 4 s: lost (30 - i) % 4 -> a2, a6 lose 0
    victims = [p.workload_id for p in preempts(plan_cycle(snap, 30.0, "fair"))]
    assert victims == ["a6"]  # of the two, the most recently started


def test_fair_never_preempts_non_preemptible_or_within_guarantee_work():
    snap = _reclaim_case()
    snap = replace(
        snap,
        running=tuple(replace(r, gang=replace(r.gang, preemptible=False)) for r in snap.running),
    )
    assert not preempts(plan_cycle(snap, 30.0, "fair"))
    # a within its guarantee: nothing to reclaim either
    fine = qsnap(
        [node("n0", gpus=8)],
        [gang("b1", team="b", gpus=4)],
        running=[running(gang("a0", team="a", gpus=8), ["n0"])],
        quotas=[q("a", 8), q("b", 8)],
    )
    assert not preempts(plan_cycle(fine, 0.0, "fair"))


def test_fair_without_preemption_waits():
    decisions = plan_cycle(_reclaim_case(), 30.0, FairPolicy(preemption=False))
    assert not preempts(decisions) and isinstance(by_id(decisions)["b1"], Wait)


def test_fair_preempts_lower_priority_work_of_the_same_team_within_its_guarantee():
    snap = qsnap(
        [node("n", gpus=4)],
        [gang("urgent", team="a", gpus=4, priority=9)],
        running=[running(gang("batch", team="a", gpus=4, priority=0), ["n"])],
        quotas=[q("a", 8)],
    )
    (p, w) = plan_cycle(snap, 0.0, "fair")
    assert p == Preempt("batch", p.reason) and "lower priority" in p.reason
    assert w.workload_id == "urgent"


# -- no starvation ---------------------------------------------------------------------


def test_fair_holds_nodes_for_a_starving_gang():
    runs = [
        running(gang("r0", gpus=4), ["n0"]),
        running(gang("r1", gpus=6), ["n1"]),
        running(gang("r2", gpus=4), ["n2"]),
    ]
    old = gang("old", workers=1, gpus=8, submitted_at=0.0)
    young = [gang(f"y{i}", gpus=1, submitted_at=100.0 * H + i) for i in range(8)]
    nodes = [node("n0", gpus=8), node("n1", gpus=8), node("n2", gpus=8)]
    snap = qsnap(nodes, [old, *young], running=runs)
    d = plan_cycle(snap, 100.0 * H, "fair")
    assert "nodes are held" in by_id(d)["old"].reason
    got = admits(d)
    assert len(got) == 6 and all(p != ("n0",) for p in got.values())  # n0 is kept for "old"
    assert len(admits(plan_cycle(snap, 1.0 * H, "fair"))) == 8  # not yet starving: no hold


def test_fair_keeps_a_capped_teams_guarantee_for_its_starving_big_gang():
    """Issue 17 (3): team a (guarantee 8, no borrowing) runs 4 GPUs; its 8-GPU gang, above
    what is left of the guarantee, starves while its 2-GPU gangs keep taking the rest."""
    ra = running(gang("ra", team="a", gpus=4), ["n"])
    big = gang("big", team="a", gpus=8, submitted_at=0.0)
    small = gang("small", team="a", gpus=2, submitted_at=99.0 * H)
    other = gang("other", team="b", gpus=2, submitted_at=99.0 * H)
    quotas = [q("a", 8, borrow_gpus=0), q("b", 8)]
    snap = qsnap([node("n", gpus=16)], [big, small, other], running=[ra], quotas=quotas)
    d = by_id(plan_cycle(snap, 100.0 * H, "fair"))
    assert isinstance(d["big"], Wait) and d["big"].kind is WaitKind.QUOTA
    assert d["small"].kind is WaitKind.QUEUED_BEHIND and "big" in d["small"].reason
    assert isinstance(d["other"], Admit), "other teams go on"
    # Not yet starving: the small gang fills the guarantee as before (work conserving).
    d = by_id(plan_cycle(snap, 1.0 * H, "fair"))
    assert isinstance(d["small"], Admit) and isinstance(d["big"], Wait)
    # Once its team's running work ends, the big gang starts.
    done = qsnap([node("n", gpus=16)], [big, small], quotas=quotas)
    d = by_id(plan_cycle(done, 100.0 * H, "fair"))
    assert isinstance(d["big"], Admit)


def test_fair_a_starving_borrower_closes_the_cohort_to_other_borrowers():
    runs = [running(gang("r0", gpus=4), ["n0"]), running(gang("r1", gpus=6), ["n1"])]
    old = gang("old", workers=1, gpus=8, submitted_at=0.0)
    young = [gang(f"y{i}", gpus=1, submitted_at=100.0 * H + i) for i in range(3)]
    snap = qsnap([node("n0", gpus=8), node("n1", gpus=8)], [old, *young], running=runs)
    d = by_id(plan_cycle(snap, 100.0 * H, "fair"))
    assert "6 idle GPUs to lend" in d["old"].reason
    assert all("to old first" in d[f"y{i}"].reason for i in range(3))


def test_decisions_cover_every_pending_gang_once():
    snap = _reclaim_case()
    for policy in ("fifo", "backfill", "fair"):
        decisions = plan_cycle(snap, 30.0, policy)
        by_id([d for d in decisions if not isinstance(d, Preempt)])
        assert {d.workload_id for d in decisions if not isinstance(d, Preempt)} == {"b1"}
