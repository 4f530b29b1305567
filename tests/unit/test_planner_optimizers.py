"""Training memory by optimizer, master weights, offload, QLoRA and LoRA targets.

Each published figure is cited next to its assertion with a tolerance; where no published
figure was found, the formula's parts are checked against values computed by hand (said so).
"""

from __future__ import annotations

import pytest

from aicluster.planner.assumptions import Assumptions
from aicluster.planner.catalog import load_catalog
from aicluster.planner.hardware import GB, GIB, Gpu, ModelShape
from aicluster.planner.memory import (
    adafactor_state_values,
    lora_params,
    model_state,
    param_counts,
)
from aicluster.planner.optimizers import bytes_per_param, optimizer_state_bytes
from aicluster.planner.training import TrainRequest, choose_layout, memory_per_gpu

CAT = load_catalog()
A = Assumptions()
HF_ANATOMY = "https://huggingface.co/docs/transformers/model_memory_anatomy"

# LLaMA 65B (Touvron et al. 2023, "LLaMA: Open and Efficient Foundation Language Models",
# arXiv:2302.13971, Table 2: 80 layers, dim 8192, 64 heads; params.json: ffn 22016).
LLAMA_65B = ModelShape(
    key="llama-65b",
    name="LLaMA 65B",
    layers=80,
    hidden_size=8192,
    attention_heads=64,
    vocab_size=32000,
    intermediate_size=22016,
)
# NVIDIA V100 SXM2 32 GB (V100 datasheet: 32 GB HBM2, 900 GB/s, 125 TFLOPS tensor, 300 W).
V100 = Gpu(
    key="v100-32gb",
    name="V100 32GB",
    memory_gib=32,
    memory_bandwidth_gb_s=900,
    bf16_tflops=125,
    tdp_w=300,
)


def gpt(layers: int, hidden: int) -> ModelShape:
    """A GPT-2-style block stack (4h MLP, no gate, GPT-2 vocabulary)."""
    return ModelShape(
        key=f"gpt-{layers}x{hidden}",
        name="GPT",
        layers=layers,
        hidden_size=hidden,
        attention_heads=hidden // 128,
        vocab_size=50257,
        intermediate_size=4 * hidden,
        gated_mlp=False,
    )


def request(model: ModelShape, gpu: Gpu, **kw) -> TrainRequest:
    base = {
        "name": "t",
        "model": model,
        "gpu": gpu,
        "gpus_per_node": 1,
        "node_network_gb_s": 12.5,
        "tokens": 1e9,
        "sequence_length": 1024,
        "micro_batch": 1,
        "checkpointing": "full",
        "strategy": "ddp",
        "gpus": 1,
    }
    base.update(kw)
    return TrainRequest(**base)


# --- optimizer state per parameter -----------------------------------------------------


def test_optimizer_state_bytes_match_hugging_face_anatomy():
    # Hugging Face Transformers docs, "Model training anatomy" (HF_ANATOMY), Optimizer States:
    # 8 bytes/param for normal AdamW, 2 bytes/param for 8-bit AdamW (bitsandbytes),
    # 4 bytes/param for SGD with momentum. 8-bit adds one fp32 absmax per 2048 values.
    assert optimizer_state_bytes("adamw", 1e9) == pytest.approx(8e9, rel=1e-9)
    assert optimizer_state_bytes("adamw_8bit", 1e9) == pytest.approx(2e9, rel=0.005)
    assert optimizer_state_bytes("paged_adamw_8bit", 1e9) == pytest.approx(2e9, rel=0.005)
    assert optimizer_state_bytes("sgd_momentum", 1e9) == pytest.approx(4e9, rel=1e-9)
    assert optimizer_state_bytes("sgd", 1e9) == 0.0


def test_bytes_per_param_by_optimizer():
    # ZeRO (Rajbhandari et al. 2020, arXiv:1910.02054) Sec. 3.1: mixed-precision Adam = 16Ψ.
    assert bytes_per_param("adamw") == 16
    # The rest follow from 2 (bf16 weights) + 2 (bf16 grads) + 4 (fp32 master, if kept)
    # + the state bytes above (hand-computed from the HF anatomy figures):
    assert bytes_per_param("adamw_bf16") == 8  # 2 + 2 + 2x2 bf16 states, no master
    assert bytes_per_param("adamw_8bit") == pytest.approx(10, rel=0.001)
    assert bytes_per_param("sgd") == 8
    assert bytes_per_param("sgd_momentum") == 12
    assert bytes_per_param("adamw", master_weights=False) == 12


def test_llama_65b_16_bit_finetuning_needs_over_780_gb():
    # Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized LLMs" (arXiv:2305.14314),
    # Sec. 1: "regular 16-bit finetuning of a LLaMA 65B parameter model requires more than
    # 780 GB of GPU memory" = 16-bit weights + grads + two fp32 Adam states (12 bytes/param).
    psi = param_counts(LLAMA_65B).total
    assert psi == pytest.approx(65.2e9, rel=0.005)  # LLaMA paper Table 2: 65.2B
    s = model_state(psi, 0, "ddp", 1, optimizer="adamw", master_weights=False)
    total = s.weights + s.gradients + s.optimizer
    assert 780 * GB <= total <= 780 * GB * 1.05
    # mixed precision with an fp32 master copy is a third more again (16 bytes/param)
    with_master = sum(memory_state_parts(psi, master=True))
    assert with_master == pytest.approx(total * 16 / 12, rel=1e-9)


def memory_state_parts(psi: float, master: bool) -> tuple[float, float, float]:
    s = model_state(psi, 0, "ddp", 1, optimizer="adamw", master_weights=master)
    return s.weights, s.gradients, s.optimizer


def test_qlora_65b_fits_one_48gb_gpu():
    # QLoRA (arXiv:2305.14314) abstract: "finetune a 65B parameter model on a single 48GB
    # GPU"; Sec. 4 / their scripts: LoRA r=64 on all linear layers, paged AdamW (32-bit
    # states), bf16 adapters, gradient checkpointing, sequence length 512 and batch 1.
    gpu48 = Gpu("a6000", "RTX A6000", 48 * GB / GIB, 768, 155, 300)
    r = request(
        LLAMA_65B,
        gpu48,
        method="qlora",
        lora_rank=64,
        lora_targets="all",
        optimizer="paged_adamw",
        master_weights=False,
        sequence_length=512,
    )
    mem = memory_per_gpu(r, A, "ddp", 1, 1, 1)
    assert mem.total <= 48 * GB  # published: fits in 48 GB
    # NF4 blocks (~33.5 GB) + 16-bit embeddings/head (~1 GB) + bf16 adapters (~1.6 GB)
    assert mem.weights == pytest.approx(36.06e9, rel=0.01)
    assert mem.total >= 0.8 * 48 * GB  # fits with ~7 GB to spare (planner: 40.7 GB)
    assert mem.host == pytest.approx(8 * lora_params(LLAMA_65B, 64, "all"), rel=1e-9)
    # without paging the same run does not fit
    unpaged = memory_per_gpu(
        TrainRequest(**{**r.__dict__, "optimizer": "adamw", "master_weights": None}),
        A,
        "ddp",
        1,
        1,
        1,
    )
    assert unpaged.total > 48 * GB


def test_qlora_keeps_embeddings_and_lm_head_in_16_bit():
    # bitsandbytes replaces nn.Linear layers of the blocks only (not nn.Embedding) and
    # transformers skips the output head, so embeddings, LM head and norms stay 16-bit.
    # No published byte count was found; checked against parts computed by hand:
    # Llama 2 7B: 32000 x 4096 = 131,072,000 each for embedding and head.
    m = CAT.get("models", "llama-2-7b")
    c = param_counts(m)
    assert c.embedding == c.lm_head == 131_072_000
    mem = memory_per_gpu(
        request(m, CAT.get("gpus", "h100-sxm"), method="qlora", lora_rank=16), A, "ddp", 1, 1, 1
    )
    lora = lora_params(m, 16, "all")
    expected = c.linear * (4 + 0.127) / 8 + (c.total - c.linear) * 2 + 2 * lora
    assert mem.weights == pytest.approx(expected, rel=1e-9)
    # 16-bit embeddings + head add ~0.39 GB over storing them in NF4
    all_nf4 = c.total * (4 + 0.127) / 8 + 2 * lora
    assert mem.weights - all_nf4 == pytest.approx((c.total - c.linear) * (2 - 4.127 / 8))


def test_zero_offload_trains_13b_on_one_32gb_gpu():
    # Ren et al. 2021, "ZeRO-Offload: Democratizing Billion-Scale Model Training"
    # (arXiv:2101.06840), abstract: trains "over 13 billion parameters on a single GPU"
    # (V100 32GB), while "PyTorch alone" reaches "1.4B parameter model, the largest that
    # can be trained without running out of memory".
    m13 = gpt(40, 5120)
    assert param_counts(m13).total == pytest.approx(13e9, rel=0.02)
    off = request(m13, V100, offload_optimizer=True)
    mem = memory_per_gpu(off, A, "ddp", 1, 1, 1)
    assert mem.total <= V100.memory_bytes
    assert mem.optimizer == mem.gradients == 0
    assert mem.host == pytest.approx(param_counts(m13).total * 14, rel=1e-9)  # 2 + 4 + 8
    assert not choose_layout(request(m13, V100), A, 1).fits
    m14 = gpt(24, 2048)  # GPT-2-style 1.4B (untied head)
    assert param_counts(m14).total == pytest.approx(1.4e9, rel=0.02)
    assert choose_layout(request(m14, V100), A, 1).fits
    m28 = gpt(48, 2048)  # twice the blocks: does not fit without offload
    assert not choose_layout(request(m28, V100), A, 1).fits


def test_adafactor_state_is_factored():
    # Shazeer & Stern 2018 (arXiv:1804.04235) Sec. 3: an n x m matrix keeps n + m values.
    # Hand-computed for a 1-layer GPT block, h = 256, f = 1024, V = 1000, untied:
    m = ModelShape("tiny", "tiny", 1, 256, 2, 1000, intermediate_size=1024, gated_mlp=False)
    blocks = 4 * (256 + 256) + 2 * (256 + 1024)  # q, k, v, o + up, down
    heads = 2 * (1000 + 256)  # embedding and LM head
    norms = 2 * 256 + 256
    assert adafactor_state_values(m) == blocks + heads + norms
    # against 8 bytes/param for AdamW states, Adafactor's is < 1% for a 7B model
    big = CAT.get("models", "llama-2-7b")
    psi = param_counts(big).total
    assert 4 * adafactor_state_values(big) < 0.01 * 8 * psi


def test_lora_qv_matches_lora_paper_and_peft():
    # Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"
    # (arXiv:2106.09685) Table 4: GPT-3 175B, LoRA on W_q and W_v: 4.7M (r=1) and 37.7M (r=8).
    g3 = CAT.get("models", "gpt-3-175b")
    assert lora_params(g3, 1, "qv") == pytest.approx(4.7e6, rel=0.01)
    assert lora_params(g3, 8, "qv") == pytest.approx(37.7e6, rel=0.01)
    # PEFT's print_trainable_parameters for Llama 2 7B, r=8, target_modules q_proj, v_proj:
    # "trainable params: 4,194,304" (Hugging Face PEFT docs / LoRA guides).
    l7 = CAT.get("models", "llama-2-7b")
    assert lora_params(l7, 8, ["q_proj", "v_proj"]) == 4_194_304
    assert lora_params(l7, 8, "qv") == 4_194_304
    # all linear layers is ~10x more for Llama 2 7B (MLP matrices are 11008 wide)
    assert lora_params(l7, 8, "all") == 32 * 8 * (4 * 8192 + 3 * (4096 + 11008))


# --- the spec ------------------------------------------------------------------------------

TRAIN = """kind: plan
name: p
hardware: {node: server-4x-l40s, network: ethernet-25g}
train:
  - name: ft
    model: llama-2-7b
    tokens: 100M
    gpus: 1
"""


def _train_memory(extra: str) -> dict:
    from aicluster.planner.inputs import resolve
    from aicluster.planner.plan import make_plan, plan_to_dict
    from aicluster.planner.spec import load_plan_spec_text

    plan = plan_to_dict(make_plan(resolve(load_plan_spec_text(TRAIN + extra), CAT)))
    return plan["train"][0]


def test_spec_optimizer_offload_and_lora_modules_reach_the_plan():
    base = _train_memory("    method: full\n")
    eight = _train_memory(
        "    method: full\n    optimizer: adamw_8bit\n    master_weights: false\n"
    )
    psi = param_counts(CAT.get("models", "llama-2-7b")).total
    opt = "optimizer"
    assert base["layout"]["memory_per_gpu_bytes"][opt] == pytest.approx(12 * psi)
    assert eight["layout"]["memory_per_gpu_bytes"][opt] == pytest.approx(2 * psi, rel=0.005)
    off = _train_memory("    method: full\n    offload_optimizer: true\n")
    assert off["layout"]["memory_per_gpu_bytes"]["host"] == pytest.approx(14 * psi)
    qv = _train_memory("    method: lora\n    lora_rank: 8\n    lora_targets: [q_proj, v_proj]\n")
    assert qv["trainable_params"] == 4_194_304


def test_spec_rejects_an_unknown_lora_module_and_optimizer():
    from aicluster.planner.spec import load_plan_spec_text
    from aicluster.specs import SpecError

    with pytest.raises(SpecError) as info:
        load_plan_spec_text(TRAIN + "    lora_targets: [q_proj, qkv]\n    optimizer: lion\n")
    found = {i.field: i.message for i in info.value.issues}
    assert found["train.0.lora_targets"].startswith(
        "unknown module 'qkv'; use all, attention, qv or a list of module names from q_proj"
    )
    assert "'adamw_8bit'" in found["train.0.optimizer"]
