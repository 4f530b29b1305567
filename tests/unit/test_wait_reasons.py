"""Wait reasons name the resource that is really short (core.bottleneck via core.topology),
for every resource kind, under every policy: CPU, memory, GPUs, GPU model, fragmentation,
and the could-never-fit sentence."""

from __future__ import annotations

from dataclasses import replace

import pytest

from aicluster.core.bottleneck import room, short_dimensions
from aicluster.core.model import Res, WaitKind
from aicluster.core.scheduler import POLICY_NAMES, plan_cycle

from builders import GiB, gang, node, snapshot, waits

ALL = pytest.mark.parametrize("policy", POLICY_NAMES)


def wait(nodes, g, policy):
    return waits(plan_cycle(snapshot(nodes, [g]), 0.0, policy))[g.workload_id]


def reason(nodes, g, policy) -> str:
    return wait(nodes, g, policy).reason


@ALL
def test_a_cpu_shortage_is_called_a_cpu_shortage(policy):
    w = wait([node("n1", cpus=4, used_cpus=3.5)], gang("c", cpus=1), policy)
    r = w.reason
    assert w.kind is WaitKind.CAPACITY and not w.never_fits
    assert r.startswith("waiting for capacity")
    assert "not enough CPU: 0.5 CPU free" in r and "GPU" not in r.split(";")[1]


@ALL
def test_a_memory_shortage_is_called_a_memory_shortage(policy):
    nodes = [node("n1", memory=8 * GiB, used_memory=7 * GiB)]
    r = reason(nodes, gang("m", memory=2 * GiB), policy)
    assert "not enough memory: 1.0 GiB free" in r and "CPU:" not in r


@ALL
def test_a_gpu_shortage_is_called_a_gpu_shortage(policy):
    r = reason([node("n1", gpus=8, used_gpus=7)], gang("g", gpus=2), policy)
    assert "not enough GPUs: 1 GPU free" in r


@ALL
def test_a_gpu_model_shortage_counts_only_that_model(policy):
    nodes = [node("a", gpus=8, gpu_model="A100"), node("h", gpus=8, used_gpus=8, gpu_model="H100")]
    r = reason(nodes, gang("h", gpus=1, gpu_model="H100"), policy)
    assert "not enough GPUs: 0 GPUs free on H100 nodes" in r


@ALL
def test_two_short_resources_are_both_named(policy):
    nodes = [node("n1", cpus=4, used_cpus=4, gpus=2, used_gpus=2)]
    r = reason(nodes, gang("b", cpus=1, gpus=1), policy)
    assert "not enough CPU and GPUs: 0 CPU free, 0 GPUs free" in r


@ALL
def test_fragmentation_is_not_blamed_on_one_resource(policy):
    # 4 CPUs and 2 GPUs are free in all, but the CPUs and the GPUs are on different nodes
    nodes = [node("cpu", cpus=4, gpus=2, used_gpus=2), node("gpu", cpus=4, used_cpus=4, gpus=2)]
    w = wait(nodes, gang("f", cpus=2, gpus=1), policy)
    assert "not together on few enough nodes" in w.reason and w.kind is WaitKind.CAPACITY


@ALL
def test_gpus_free_but_spread_out_is_a_locality_wait(policy):
    nodes = [node("a", gpus=8, used_gpus=4), node("b", gpus=8, used_gpus=4)]
    w = wait(nodes, replace(gang("l", gpus=8), locality="node"), policy)
    assert w.kind is WaitKind.LOCALITY and "spread out" in w.reason


@ALL
def test_never_fits_names_the_resource_no_pool_has(policy):
    w = wait([node("n1", cpus=8)], gang("big", cpus=16), policy)
    r = w.reason
    assert w.kind is WaitKind.NEVER_FITS and w.never_fits
    assert r.startswith("could never fit") and r.endswith(
        "the largest pool has 8 CPU on 1 matching node(s)"
    )
    r = reason([node("n1", cpus=8, memory=16 * GiB)], gang("fat", memory=64 * GiB), policy)
    assert r.endswith("the largest pool has 16.0 GiB on 1 matching node(s)")


@ALL
def test_never_fits_without_any_node_does_not_speak_of_a_model_none(policy):
    r = reason([node("n1", schedulable=False)], gang("x", cpus=1), policy)
    assert r.startswith("could never fit") and "None" not in r


def test_room_counts_workers_per_dimension():
    per = Res(cpus=1.5, memory=GiB, gpus=0)
    free = Res(cpus=4.0, memory=3 * GiB, gpus=0)
    assert (room(free, per, "cpus"), room(free, per, "memory")) == (2, 3)
    assert room(free, per, "gpus") == float("inf")
    assert short_dimensions([free, free], gang("g", workers=5, cpus=1.5, memory=GiB)) == {
        "cpus": 8.0
    }
