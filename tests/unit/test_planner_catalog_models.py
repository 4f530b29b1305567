"""Catalog additions: each model's parameter count from its config against the model card,
and GPU figures against their datasheets (sources in the catalog entries); Gemma 2/3's
alternating local and global attention and DeepSeek-V3's latent attention and experts,
with their KV cache computed by hand in the tests."""

from __future__ import annotations

from dataclasses import replace

import pytest

from aicluster.planner.catalog import load_catalog, load_catalog_data
from aicluster.planner.inputs import resolve
from aicluster.planner.memory import kv_bytes_per_sequence, kv_bytes_per_token, param_counts
from aicluster.planner.plan import make_plan, plan_to_dict
from aicluster.planner.spec import load_plan_spec_text
from aicluster.planner.training import attended_tokens, attention_flops_per_token
from aicluster.specs import SpecError

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
    c = CAT.get("gpus", "a100-40gb-pcie")  # A100 datasheet, 40GB PCIe column
    assert (c.memory_gib, c.memory_bandwidth_gb_s, c.bf16_tflops, c.tdp_w) == (40, 1555, 312, 250)
    assert c.nvlink_gb_s is None  # its bridge pairs two GPUs: tensor parallel over PCIe
    assert CAT.get("nodes", "server-8x-a100-40gb-pcie").gpu == "a100-40gb-pcie"
    assert CAT.get("nodes", "dgx-b200").gpu == "b200"


def test_every_catalog_entry_names_its_sources():
    # the rule: every figure with its source (a datasheet, config.json, paper, or
    # the word "assumption")
    data = load_catalog_data()
    for section, entries in data.items():
        for key, entry in entries.items():
            sources = entry.get("sources") or {}
            assert sources and all(str(v).strip() for v in sources.values()), (section, key)


# --- Gemma 2 / Gemma 3 (alternating local and global attention) and DeepSeek-V3 (MLA, MoE)


@pytest.mark.parametrize(
    ("key", "published", "rel"),
    [
        ("gemma-2-9b", 9.24e9, 0.005),  # google/gemma-2-9b: 9.24B (planner 9.2414B)
        ("gemma-2-27b", 27.2e9, 0.005),  # google/gemma-2-27b: 27.2B (planner 27.227B)
        ("deepseek-v3", 671e9, 0.005),  # DeepSeek-V3 report: 671B total (planner 671.03B)
    ],
)
def test_gemma_2_and_deepseek_v3_totals(key, published, rel):
    assert param_counts(CAT.get("models", key)).total == pytest.approx(published, rel=rel)


@pytest.mark.parametrize(
    ("key", "embedding", "non_embedding"),
    [
        # Gemma 3 report (arXiv:2503.19786) Table 1, text model (vision encoder apart):
        ("gemma-3-12b", 1_012e6, 10_759e6),  # planner 1,006.9M and 10,758.8M
        ("gemma-3-27b", 1_416e6, 25_600e6),  # planner 1,409.6M and 25,599.0M
    ],
)
def test_gemma_3_parameters_against_its_report(key, embedding, non_embedding):
    c = param_counts(CAT.get("models", key))
    assert c.total - c.embedding == pytest.approx(non_embedding, rel=0.001)
    assert c.embedding == pytest.approx(embedding, rel=0.01)  # the report's vocab rounds up


def test_non_embedding_parameters_against_a_model_card_and_in_the_plan():
    # Qwen2.5-7B-Instruct model card (huggingface.co/Qwen/Qwen2.5-7B-Instruct): "Number of
    # Parameters: 7.61B", "Number of Paramaters (Non-Embedding): 6.53B" (untied: embedding
    # and LM head of 152,064 x 3,584 each, 1.09B, both left out)
    c = param_counts(CAT.get("models", "qwen2.5-7b"))
    assert c.non_embedding == pytest.approx(6.53e9, rel=0.005)
    d = plan_to_dict(
        make_plan(
            resolve(
                load_plan_spec_text(
                    "kind: plan\nname: p\nserve:\n  - {name: s, model: qwen2.5-7b}\n"
                    "train:\n  - {name: t, model: gemma-3-12b, tokens: 1B}\n"
                ),
                CAT,
            )
        )
    )
    assert d["serve"][0]["non_embedding_params"] == pytest.approx(c.non_embedding)
    # Gemma 3 12B (tied): the report's 10,759M non-embedding (planner 10,758.8M)
    assert d["train"][0]["non_embedding_params"] == pytest.approx(10_759e6, rel=0.001)


def test_deepseek_v3_activated_parameters():
    # Report abstract: "671B total parameters with 37B activated for each token";
    # README_WEIGHTS.md of the release: 36.6B activated "including 0.9B for the output
    # Head" (so without the input embedding, a lookup). Per token: 61 MLA blocks, 3 dense
    # MLPs, 58 x (8 routed + 1 shared) experts of 2048, the routers, the head.
    c = param_counts(CAT.get("models", "deepseek-v3"))
    assert c.active - c.embedding == pytest.approx(36.6e9, rel=0.005)  # planner 36.63B
    assert c.active == pytest.approx(37e9, rel=0.02)  # planner 37.55B (+1.5%: embedding)
    # the routed experts, what expert parallelism shards: 58 x 256 x 3 x 7168 x 2048
    assert c.routed == 58 * 256 * 3 * 7168 * 2048


def test_gemma_2_kv_cache_alternates_local_and_global_layers():
    m = CAT.get("models", "gemma-2-9b")
    # bf16, per token and layer: 2 (K, V) x 8 KV heads x 256 head_dim x 2 B = 8,192 B;
    # over 42 layers 344,064 B (the figure a full-attention token would need)
    assert kv_bytes_per_token(m) == 2 * 42 * 8 * 256 * 2 == 344_064
    # an 8192-token sequence: the 21 global layers keep 8192 tokens, the 21 local layers
    # (every other one, window 4096) keep 4096: 8,192 B x (21 x 8192 + 21 x 4096)
    assert kv_bytes_per_sequence(m, 8192) == 8192 * (21 * 8192 + 21 * 4096) == 2_113_929_216
    # up to the window all layers keep everything
    assert kv_bytes_per_sequence(m, 4096) == 344_064 * 4096


def test_gemma_3_kv_cache_five_local_layers_per_global_one():
    m = CAT.get("models", "gemma-3-27b")
    assert m.global_layers == 10  # 62 layers, every 6th global (sliding_window_pattern 6)
    # 128k tokens: per layer and token 2 x 16 x 128 x 2 = 8,192 B; 10 global layers keep
    # 131,072 tokens, 52 local ones 1,024: 8,192 x 1,363,968 = 11.17 GB, not the 66.6 GB
    # that full attention in all 62 layers would keep (6x less)
    per_layer = 2 * 16 * 128 * 2
    assert kv_bytes_per_sequence(m, 131072) == per_layer * (10 * 131072 + 52 * 1024)
    full = replace(m, sliding_window=None, sliding_window_pattern=None)
    assert kv_bytes_per_sequence(full, 131072) == per_layer * 62 * 131072


def test_deepseek_v3_caches_the_mla_latent_not_the_heads():
    m = CAT.get("models", "deepseek-v3")
    # per layer and token: kv_lora_rank 512 + qk_rope_head_dim 64 values (DeepSeek-V2,
    # arXiv:2405.04434, Table 1: (d_c + d_h^R)·l); bf16: 61 x 576 x 2 = 70,272 B; fp8 half
    assert kv_bytes_per_token(m) == 61 * (512 + 64) * 2 == 70_272
    assert kv_bytes_per_token(m, "fp8") == 35_136
    # full per-head K (128 + 64) and V (128) for 128 heads would be 71x more
    assert 61 * 128 * (192 + 128) * 2 / kv_bytes_per_token(m) == pytest.approx(71.1, rel=0.01)
    # the latent has no heads: tensor parallelism does not split it (every rank keeps it)
    assert m.kv_shards(8) == 1
    assert CAT.get("models", "llama-3-70b").kv_shards(8) == 8


def test_attention_flops_follow_the_layer_pattern_and_mla_widths():
    g = CAT.get("models", "gemma-2-9b")
    # 8192 tokens: a global layer sees 4096 keys on average (causal), a local one
    # 4096 x (1 - 4096 / 16384) = 3072; half the layers each: 3584
    assert attended_tokens(g, 8192) == 3584
    assert attention_flops_per_token(g, 8192) == 12 * 42 * 16 * 256 * 3584
    d = CAT.get("models", "deepseek-v3")
    # training: scores over 128 + 64 dims, values 128: width 128 x (192 + 128) / 2
    assert d.attention_width() == 128 * (192 + 128) / 2
    # decoding with absorbed up-projections: scores over 512 + 64, values over 512
    assert d.attention_width(absorbed=True) == 128 * (512 + 64 + 512) / 2


def test_new_models_serve_and_train():
    # DeepSeek-V3 fp8 on 8 x H200 (about 672 GB of weights) fits with TP 8 and no pipeline;
    # Gemma 2 27B's KV per sequence in the plan is the alternating figure
    text = (
        "kind: plan\nname: p\nhardware: {node: dgx-h200}\nserve:\n"
        "  - {name: ds, model: deepseek-v3, precision: fp8, context_length: 32768}\n"
        "  - {name: g2, model: gemma-2-27b, context_length: 8192}\n"
    )
    d = plan_to_dict(make_plan(resolve(load_plan_spec_text(text), CAT)))
    ds, g2 = d["serve"]
    chosen = ds["chosen"]
    assert ds["fits"] and (chosen["tensor_parallel"], chosen["pipeline_parallel"]) == (8, 1)
    assert ds["weight_bytes"] == pytest.approx(672.9e9, rel=0.001)
    per_layer = 2 * 16 * 128 * 2
    assert g2["kv_bytes_per_sequence"] == per_layer * (23 * 8192 + 23 * 4096)


def test_sliding_window_pattern_needs_a_window():
    text = (
        "kind: plan\nname: p\nserve:\n  - name: x\n    architecture: {layers: 4, hidden_size: 512, "
        "attention_heads: 8, vocab_size: 1000, sliding_window_pattern: 2}\n"
    )
    with pytest.raises(SpecError) as info:
        load_plan_spec_text(text)
    assert "sliding_window_pattern needs sliding_window" in str(info.value)
