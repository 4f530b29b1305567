"""Serving memory: what the engine keeps out of its budget, against vLLM's own profile.

vLLM PR #10511 (github.com/vllm-project/vllm/pull/10511), "Memory profiling results" for
`vllm serve meta-llama/Meta-Llama-3-8B` on H100 (total_gpu_memory 79.22 GiB,
gpu_memory_utilization 0.90 -> 71.29 GiB): TP 1: weights 14.96 GiB, non_torch 1.79 GiB,
activation peak 1.26 GiB, available_kv_cache_memory 53.29 GiB; TP 2: weights 7.48 GiB,
non_torch 3.58 GiB, activation peak 1.26 GiB (KV: 71.29 - 7.48 - 3.58 - 1.26 = 58.97 GiB).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from aicluster.planner.assumptions import Assumptions
from aicluster.planner.catalog import load_catalog
from aicluster.planner.hardware import GIB
from aicluster.planner.inference import (
    ServeRequest,
    activation_peak_bytes,
    engine_reserve_bytes,
    evaluate,
)
from aicluster.planner.memory import kv_bytes_per_token

CAT = load_catalog()
A = Assumptions()
VLLM = "vLLM PR #10511 memory profile, Llama 3 8B, H100"
MODEL = CAT.get("models", "llama-3-8b")
H100 = replace(CAT.get("gpus", "h100-sxm"), memory_gib=79.22)  # as CUDA reports it


def kv_gib(tp: int) -> float:
    r = ServeRequest(name="v", model=MODEL, gpu=H100, gpus_per_node=8, context_length=8192)
    opt = evaluate(r, A, tp, 1)
    per_gpu_token = kv_bytes_per_token(MODEL) / tp
    return opt.kv_capacity_tokens * per_gpu_token / GIB


def test_activation_peak_matches_vllm_profile():
    # published 1.26 GiB at TP 1 and TP 2; planner 1.15 GiB (-9%)
    assert activation_peak_bytes(MODEL, A) / GIB == pytest.approx(1.26, rel=0.10), VLLM


def test_kv_cache_budget_matches_vllm_at_tp1_and_tp2():
    # TP 1: published 53.29 GiB, planner 53.39 (+0.2%); TP 2: 58.97, planner 59.07 (+0.2%)
    assert kv_gib(1) == pytest.approx(53.29, rel=0.02), VLLM
    assert kv_gib(2) == pytest.approx(58.97, rel=0.02), VLLM


def test_reserve_grows_with_tensor_parallel_buffers_and_model():
    # TP adds NCCL / custom all-reduce buffers: 3.58 - 1.79 GiB in the profile
    tp1, tp2 = engine_reserve_bytes(MODEL, A, 1), engine_reserve_bytes(MODEL, A, 2)
    assert (tp2 - tp1) / GIB == pytest.approx(3.58 - 1.79, rel=0.02), VLLM
    # a 70B model's wider MLP (28672) needs a larger activation peak than the 8B's (14336)
    big = CAT.get("models", "llama-3.1-70b")
    assert activation_peak_bytes(big, A) > 1.5 * activation_peak_bytes(MODEL, A)
