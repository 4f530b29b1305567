"""Team quotas, borrowing and lending within a cohort (core.quota.QuotaBook)."""

from __future__ import annotations

from aicluster.core.model import Quota, Res, RunningWorkload, Snapshot
from aicluster.core.quota import QuotaBook

from builders import gang, node, snapshot


def book(quotas, running=(), gpus=32) -> QuotaBook:
    snap = Snapshot(nodes=(), pending=(), running=tuple(running), quotas=tuple(quotas))
    return QuotaBook(snap, {"default": gpus})


def run(team, gpus, wid="r"):
    return RunningWorkload(gang(wid, team=team, gpus=gpus), ("n",), 0.0)


G = lambda n: Res(gpus=n)


def test_within_guarantee_and_borrowing_from_idle_quota():
    b = book([Quota("a", "default", 8), Quota("b", "default", 8)], gpus=16)
    assert b.within_guarantee("a", "default", G(8))
    assert not b.within_guarantee("a", "default", G(9))
    assert b.admissible("a", "default", G(16)) is None  # b lends all 8 idle GPUs
    assert "exhausted" in b.admissible("a", "default", G(9), borrow=False)
    b.charge("a", "default", G(12))
    assert b.is_borrowing("a", "default")
    assert b.within_guarantee("b", "default", G(8))  # b's guarantee is still b's
    assert b.admissible("b", "default", G(5)) is None  # b's by right (a gets preempted)
    reason = b.admissible("b", "default", G(9))
    assert reason is not None and "cohort default" in reason  # nobody lends to b


def test_borrowing_limit_is_a_ceiling():
    b = book([Quota("a", "default", 4, borrow_gpus=2), Quota("b", "default", 28)])
    assert b.ceiling("a", "default") == 6
    assert b.admissible("a", "default", G(6)) is None
    assert "at most 4 guaranteed + 2 borrowed" in b.admissible("a", "default", G(7))


def test_lending_limit_caps_what_others_borrow():
    b = book([Quota("a", "default", 8), Quota("b", "default", 24, lend_gpus=4)])
    assert b.admissible("a", "default", G(12)) is None
    assert b.admissible("a", "default", G(13)) is not None


def test_cohorts_do_not_lend_to_each_other():
    b = book([Quota("a", "default", 8, cohort="x"), Quota("b", "default", 24, cohort="y")])
    assert b.admissible("a", "default", G(9)) is not None


def test_unassigned_gpus_are_shared_by_the_default_cohort():
    b = book([Quota("a", "default", 8)], gpus=32)
    assert b.admissible("a", "default", G(32)) is None
    assert b.admissible("nobody", "default", G(24)) is None  # no quota: borrows
    assert b.fits_partition("nobody", "default", G(24)) is None
    assert b.fits_partition("nobody", "default", G(25)) is not None
    assert b.fits_partition("a", "default", G(9)) is not None


def test_running_work_is_charged_and_refund_restores():
    b = book([Quota("a", "default", 8), Quota("b", "default", 8)], [run("a", 12)], gpus=16)
    assert b.is_borrowing("a", "default")
    assert b.share("a") > b.share("b") == 0
    b.refund("a", "default", G(12))
    assert not b.is_borrowing("a", "default")
    assert b.admissible("b", "default", G(16)) is None


def test_no_quotas_means_one_shared_partition():
    b = book([], gpus=16)
    assert b.admissible("x", "default", G(16)) is None
    b.charge("x", "default", G(10))
    assert b.admissible("y", "default", G(7)) is not None
    assert b.admissible("y", "default", G(6)) is None


def test_cpu_and_memory_caps():
    b = book([Quota("a", "default", 8, cpus=4)])
    assert b.admissible("a", "default", Res(cpus=5, gpus=1)) is not None
    assert b.admissible("a", "default", Res(cpus=4, gpus=1)) is None


def test_usage_can_be_given_precomputed():
    snap = snapshot([node("n", gpus=16)], [])
    a = QuotaBook(
        Snapshot(snap.nodes, (), (run("a", 12),), (Quota("a", "default", 8),)), {"default": 16}
    )
    b = QuotaBook(
        Snapshot(
            snap.nodes,
            (),
            (),
            (Quota("a", "default", 8),),
            usage=(("a", "default", Res(1.0, 0, 12)),),
        ),
        {"default": 16},
    )
    assert a.account("a", "default").used == b.account("a", "default").used
    assert a.borrowed == b.borrowed and a.lendable == b.lendable
