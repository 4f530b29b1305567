"""Planner memory arithmetic against figures published elsewhere (each cited)."""

from __future__ import annotations

import pytest

from aicluster.planner.catalog import load_catalog
from aicluster.planner.memory import (
    activation_bytes,
    kv_bytes_per_token,
    lora_params,
    model_state_bytes,
    param_counts,
    weight_bytes,
)

CAT = load_catalog()
GB = 1e9


def model(key):
    return CAT.get("models", key)


# -- parameter counts from configs ----------------------------------------------------


@pytest.mark.parametrize(
    "key, published",
    [
        # exact counts of the Hugging Face checkpoints (sum of tensor sizes)
        ("llama-2-7b", 6_738_415_616),
        ("llama-2-13b", 13_015_864_320),
        ("llama-2-70b", 68_976_648_192),
        ("mistral-7b", 7_241_732_096),  # Mistral 7B (arXiv:2310.06825), HF checkpoint
        ("llama-3-8b", 8_030_261_248),  # model card: 8.03B
    ],
)
def test_parameter_count_from_config_is_exact(key, published):
    assert param_counts(model(key)).total == published


@pytest.mark.parametrize(
    "key, published, rel",
    [
        ("llama-3-70b", 70.6e9, 0.002),  # Meta-Llama-3-70B model card: 70.6B
        ("llama-3.1-405b", 405e9, 0.005),  # Llama 3 paper (arXiv:2407.21783) Table 3
        ("llama-3.2-1b", 1.24e9, 0.005),  # Llama-3.2-1B model card: 1.24B
        ("tinyllama-1.1b", 1.1e9, 0.005),  # TinyLlama (arXiv:2401.02385): 1.1B
        ("gpt-3-175b", 175e9, 0.005),  # GPT-3 (arXiv:2005.14165) Table 2.1
        ("mixtral-8x7b", 46.7e9, 0.002),  # Mixtral (arXiv:2401.04088): 46.7B total
    ],
)
def test_parameter_count_matches_published(key, published, rel):
    assert param_counts(model(key)).total == pytest.approx(published, rel=rel)


def test_moe_active_parameters():
    # Mixtral of Experts (arXiv:2401.04088), Sec. 2: 13B active parameters per token (12.9B)
    assert param_counts(model("mixtral-8x7b")).active == pytest.approx(12.9e9, rel=0.01)


# -- weight memory at each precision -----------------------------------------------


def test_bf16_weights_match_published_checkpoints():
    # huggingface.co/meta-llama/Llama-2-7b-hf: safetensors 9.98 GB + 3.50 GB = 13.48 GB (bf16/fp16)
    assert weight_bytes(model("llama-2-7b"), "bf16") / GB == pytest.approx(13.48, rel=0.005)
    # huggingface.co/meta-llama/Meta-Llama-3-8B: 4.98 + 5.00 + 4.92 + 1.17 = 16.07 GB
    assert weight_bytes(model("llama-3-8b"), "bf16") / GB == pytest.approx(16.07, rel=0.005)


@pytest.mark.parametrize(
    "key, billions, fp32_gb, bf16_gb",
    [
        # Hugging Face Transformers docs, "Optimizing LLMs for Speed and Memory": weights need
        # ~4·X GB in float32 and ~2·X GB in bfloat16 for X billion parameters; examples
        # "Llama-2-70b requires 2 * 70 GB = 140 GB", "GPT3 requires 2 * 175 GB = 350 GB".
        ("llama-2-70b", 70, 280, 140),
        ("gpt-3-175b", 175, 700, 350),
    ],
)
def test_fp32_and_bf16_weights_follow_the_published_rule(key, billions, fp32_gb, bf16_gb):
    m = model(key)
    assert weight_bytes(m, "fp32") / GB == pytest.approx(fp32_gb, rel=0.02)
    assert weight_bytes(m, "bf16") / GB == pytest.approx(bf16_gb, rel=0.02)


def test_quantized_weights():
    m = model("llama-2-7b")
    # 8-bit: ~1 byte per parameter (same HF docs: "X GB in 8-bit"), embeddings kept 16-bit
    assert weight_bytes(m, "int8") / GB == pytest.approx(6.74, rel=0.06)
    assert weight_bytes(m, "fp8") == weight_bytes(m, "int8")
    # 4-bit GPTQ, group size 128: TheBloke/Llama-2-7B-GPTQ main branch is 3.90 GB
    assert weight_bytes(m, "int4") / GB == pytest.approx(3.90, rel=0.02)
    # ordering holds for every model
    for key in CAT.names("models"):
        mm = model(key)
        sizes = [weight_bytes(mm, p) for p in ("fp32", "bf16", "fp8", "int4")]
        assert sizes == sorted(sizes, reverse=True)


# -- KV cache ------------------------------------------------------------------------


def test_kv_cache_opt_13b_matches_vllm_paper():
    # Kwon et al. 2023 (vLLM, arXiv:2309.06180) Sec. 3: "for the 13B parameter OPT model,
    # the KV cache of a single token demands 800 KB ... 2 x 5120 x 40 x 2"
    assert kv_bytes_per_token(model("opt-13b"), "fp16") == 2 * 5120 * 40 * 2 == 819_200


def test_kv_cache_llama_2_7b_matches_nvidia_example():
    # NVIDIA technical blog "Mastering LLM Techniques: Inference Optimization" (2023): Llama 2 7B,
    # batch 1, 4096 tokens, 16-bit: 1 x 4096 x 2 x 32 x 4096 x 2 bytes, "~2 GB"
    total = kv_bytes_per_token(model("llama-2-7b"), "bf16") * 4096
    assert total == 4096 * 2 * 32 * 4096 * 2 == 2 * 2**30


@pytest.mark.parametrize(
    "key, expected",
    [
        # Meta-Llama-3-8B config.json: 32 layers, 8 KV heads, head_dim 4096/32 = 128 (GQA)
        ("llama-3-8b", 2 * 32 * 8 * 128 * 2),  # 131,072 B = 128 KiB
        # Meta-Llama-3-70B config.json: 80 layers, 8 KV heads, head_dim 8192/64 = 128
        ("llama-3-70b", 2 * 80 * 8 * 128 * 2),  # 327,680 B = 320 KiB
        # Mistral-7B-v0.1 config.json: 32 layers, 8 KV heads, head_dim 128
        ("mistral-7b", 2 * 32 * 8 * 128 * 2),
        # Llama-3.2-1B config.json: 16 layers, 8 KV heads, head_dim 64
        ("llama-3.2-1b", 2 * 16 * 8 * 64 * 2),
    ],
)
def test_kv_cache_grouped_query_attention(key, expected):
    assert kv_bytes_per_token(model(key), "bf16") == expected


def test_gqa_shrinks_kv_by_the_head_ratio():
    # Llama 2 70B uses GQA with 8 KV heads for 64 query heads (Touvron et al. 2023, Sec. 2.2)
    m = model("llama-2-70b")
    mha = 2 * m.layers * m.attention_heads * m.d_head * 2
    assert kv_bytes_per_token(m, "bf16") * 8 == mha
    assert kv_bytes_per_token(m, "fp8") * 2 == kv_bytes_per_token(m, "bf16")


# -- training memory -----------------------------------------------------------------


def test_mixed_precision_adam_is_16_bytes_per_parameter():
    # Rajbhandari et al. 2020 (ZeRO, arXiv:1910.02054) Sec. 3.1: 2Ψ + 2Ψ + KΨ with K = 12,
    # "a 1.5B parameter GPT-2 ... requires at least 24 GB of memory"
    w, g, o = model_state_bytes(1.5e9, 0, "ddp", dp=1)
    assert (w, g, o) == (3e9, 3e9, 18e9)
    assert (w + g + o) / GB == 24


@pytest.mark.parametrize(
    "strategy, gb",
    [
        # ZeRO paper Figure 1: Ψ = 7.5B, K = 12, Nd = 64 devices
        ("ddp", 120),
        ("zero1", 31.4),  # P_os
        ("zero2", 16.6),  # P_os+g
        ("zero3", 1.9),  # P_os+g+p
    ],
)
def test_zero_stages_match_paper_figure_1(strategy, gb):
    total = sum(model_state_bytes(7.5e9, 0, strategy, dp=64)) / GB
    assert round(total, 1) == gb


def test_model_parallel_divides_state_and_lora_freezes_base():
    assert sum(model_state_bytes(8e9, 0, "ddp", dp=1, mp=8)) == 16e9
    # LoRA: frozen bf16 base (2 bytes/param) + 16 bytes per trainable adapter parameter
    w, g, o = model_state_bytes(4e7, 6.7e9, "ddp", dp=1)
    assert w == 2 * 4e7 + 2 * 6.7e9 and g == 2 * 4e7 and o == 12 * 4e7
    # QLoRA (Dettmers et al. 2023, Sec. 3): NF4 + double quantization = 4.127 bits per parameter
    w, _, _ = model_state_bytes(0, 6.7e9, "ddp", dp=1, frozen_bits=4.127)
    assert w == pytest.approx(6.7e9 * 4.127 / 8)


def test_activation_memory_matches_korthikanti_table_2():
    # Korthikanti et al. 2022 (arXiv:2205.05198) Eq. 1: per layer s·b·h·(34 + 5·a·s/h) bytes;
    # selective recomputation keeps 34·s·b·h; full recomputation 2·s·b·h per layer.
    m = model("gpt-3-175b")  # s=2048, h=12288, a=96 as in the paper's GPT-3 row
    s, b, h, a, L, t = 2048, 1, 12288, 96, 96, 8
    logits = s * b * m.vocab_size * 6
    none = activation_bytes(m, s, b, tp=t, checkpointing="none")
    assert none == pytest.approx((L * s * b * h * (34 + 5 * a * s / h) + logits) / t)
    sel = activation_bytes(m, s, b, tp=t, checkpointing="selective")
    assert sel == pytest.approx((L * 34 * s * b * h + logits) / t)
    full = activation_bytes(m, s, b, tp=t, checkpointing="full")
    assert full < sel < none


def test_lora_parameter_count():
    # LoRA (Hu et al. 2021) Sec. 4: r·(d_in + d_out) per adapted matrix. Llama-2-7B with r=8
    # on W_q and W_v only: 32 layers x 2 x 8 x (4096 + 4096) = 4,194,304 (the figure PEFT
    # prints for this setting: "trainable params: 4,194,304").
    m = model("llama-2-7b")
    attn = lora_params(m, 8, "attention")
    assert attn == 32 * 4 * 8 * (4096 + 4096)  # q, k, v, o
    assert attn / 2 == 4_194_304
    assert lora_params(m, 16, "all") == 32 * 16 * (4 * 8192 + 3 * (4096 + 11008))
