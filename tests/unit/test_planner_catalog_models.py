"""Catalog additions: each model's parameter count from its config against the model card,
and GPU figures against their datasheets (sources in the catalog entries)."""

from __future__ import annotations

import pytest

from aicluster.planner.catalog import load_catalog
from aicluster.planner.memory import kv_bytes_per_token, param_counts

CAT = load_catalog()


@pytest.mark.parametrize(
    ("key", "published", "active"),
    [
        ("llama-3.2-3b", 3.21e9, None),  # Llama 3.2 model card: 3.21B
        ("llama-3.3-70b", 70.6e9, None),  # Llama 3.3 model card: 70B (shape = 3.1 70B)
        ("qwen2.5-7b", 7.61e9, None),  # Qwen2.5-7B-Instruct model card: 7.61B
        ("qwen2.5-72b", 72.7e9, None),  # Qwen2.5-72B-Instruct model card: 72.7B
        ("qwen3-8b", 8.2e9, None),  # Qwen3-8B model card: 8.2B
        ("mixtral-8x22b", 141e9, 39e9),  # Mistral AI: 141B total, 39B active
    ],
)
def test_new_models_parameter_counts_match_model_cards(key, published, active):
    c = param_counts(CAT.get("models", key))
    assert c.total == pytest.approx(published, rel=0.01)
    if active:
        assert c.active == pytest.approx(active, rel=0.01)


def test_qwen_kv_cache_per_token():
    # 2 x layers x kv_heads x head_dim x 2 bytes: Qwen2.5-7B 2 x 28 x 4 x 128 x 2 = 57,344 B
    assert kv_bytes_per_token(CAT.get("models", "qwen2.5-7b")) == 57_344
    assert kv_bytes_per_token(CAT.get("models", "qwen3-8b")) == 2 * 36 * 8 * 128 * 2


def test_new_gpus_and_nodes():
    a = CAT.get("gpus", "a100-80gb-pcie")  # A100 datasheet, 80GB PCIe column
    assert (a.memory_bandwidth_gb_s, a.bf16_tflops, a.tdp_w) == (1935, 312, 300)
    b = CAT.get("gpus", "b200")  # DGX B200 datasheet / 8: 180 GB, 8 TB/s, 4.5 PF FP8 dense
    assert (b.memory_gib, b.memory_bandwidth_gb_s, b.fp8_tflops) == (180, 8000, 4500)
    assert CAT.get("nodes", "dgx-a100-40gb").gpu == "a100-40gb-sxm"
    assert CAT.get("nodes", "server-8x-a100-pcie").gpus == 8
    assert CAT.get("nodes", "dgx-b200").gpu == "b200"
