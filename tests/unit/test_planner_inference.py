"""Serving arithmetic: fit, parallelism, latency, replicas."""

from __future__ import annotations

from dataclasses import replace

import pytest

from aicluster.planner.assumptions import Assumptions
from aicluster.planner.catalog import load_catalog
from aicluster.planner.inference import (
    ServeRequest,
    decode_step_s,
    evaluate,
    plan_serving,
    weights_read_per_step,
)
from aicluster.planner.memory import weight_bytes

CAT = load_catalog()
A = Assumptions()


def request(model="llama-3-8b", gpu="h100-sxm", **kw) -> ServeRequest:
    base = {
        "name": "s",
        "model": CAT.get("models", model),
        "gpu": CAT.get("gpus", gpu),
        "gpus_per_node": 8,
    }
    base.update(kw)
    return ServeRequest(**base)


def test_8b_fits_one_h100_and_70b_needs_tensor_parallelism():
    assert plan_serving(request(), A).chosen.tp == 1
    p70 = plan_serving(request("llama-3-70b"), A)
    # 141 GB of bf16 weights cannot fit 80 GB; two GPUs hold 70.6 GB each but leave too
    # little room under vLLM's 0.9 utilisation, so the smallest fit is tp=4
    assert not evaluate(request("llama-3-70b"), A, 1, 1).fits
    assert p70.chosen.tp in (2, 4) and p70.chosen.pp == 1
    assert p70.fits


def test_405b_in_bf16_needs_pipeline_stages_across_nodes():
    p = plan_serving(request("llama-3.1-405b", context_length=8192), A)
    assert p.fits and p.chosen.tp == 8 and p.chosen.pp >= 2
    assert any("pipeline" in n for n in p.notes)


def test_fp8_halves_weights_and_fits_smaller_layout():
    bf16 = plan_serving(request("llama-3-70b"), A)
    fp8 = plan_serving(request("llama-3-70b", precision="fp8"), A)
    assert fp8.weight_bytes < 0.52 * bf16.weight_bytes
    assert fp8.chosen.gpus_per_replica <= bf16.chosen.gpus_per_replica


def test_decode_is_memory_bound_at_batch_one():
    r = request()
    step = decode_step_s(r, A, 1, 1)
    # one token reads all 16 GB of weights at 3.35 TB/s x 0.8 ≈ 6 ms, plus the fixed
    # per-layer cost (32 x 17 us) and a little KV cache
    expected = (
        weight_bytes(r.model, "bf16") / (3350e9 * 0.8) + 32 * A.step_overhead_per_layer_us * 1e-6
    )
    assert step == pytest.approx(expected, rel=0.05)
    assert decode_step_s(r, A, 1, 64) > step  # bigger batch reads more KV cache
    assert decode_step_s(r, A, 2, 1) < step  # tensor parallel splits the read


def test_tpot_target_limits_the_batch():
    loose = evaluate(request(tpot_s=None), A, 1, 1)
    tight = evaluate(request(tpot_s=0.010), A, 1, 1)
    assert tight.batch < loose.batch
    assert tight.tpot_s <= 0.010
    impossible = evaluate(request(tpot_s=0.001), A, 1, 1)
    assert impossible.batch == 0 and not impossible.latency_ok


def test_replicas_scale_with_rate_and_users():
    one = plan_serving(request(requests_per_second=1), A).chosen
    many = plan_serving(request(requests_per_second=100), A).chosen
    assert many.replicas > one.replicas
    per = many.replica_rps * A.utilization
    assert (many.replicas - 1) * per < 100 <= many.replicas * per
    users = plan_serving(request(concurrent_users=1000), A).chosen
    assert (
        users.replicas == -(-1000 // int(users.batch * A.utilization))
        or users.replicas >= 1000 / users.batch
    )


def test_moe_reads_fewer_weights_at_small_batch():
    m = CAT.get("models", "mixtral-8x7b")
    total = weight_bytes(m, "bf16")
    assert weights_read_per_step(m, "bf16", 1) < 0.35 * total
    assert weights_read_per_step(m, "bf16", 256) == pytest.approx(total, rel=1e-3)


def test_model_larger_than_a_small_gpu_does_not_fit():
    r = request("llama-3-70b", gpu="rtx-4090", gpus_per_node=1)
    p = plan_serving(r, A, max_pp=2)
    assert not p.fits and p.chosen is None
    assert replace(r, model=CAT.get("models", "llama-3.2-1b")).model.layers == 16
