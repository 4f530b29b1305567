"""Memory arithmetic: parameter counts, weights, KV cache, training state, activations.

Vocabulary: Ψ (psi) is a parameter count; `b` micro-batch sequences, `s` sequence
length, `h` hidden size, `a` attention heads, `L` layers, `t` tensor-parallel degree.
All results are bytes (float) unless the name says otherwise.

Sources (cited again next to each formula):
- [ZeRO] Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
  Parameter Models" (arXiv:1910.02054), Sec. 3.1 and 5 (16Ψ for mixed-precision Adam).
- [SP] Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models" (arXiv:2205.05198), Sec. 4, Eq. 1-2 and Table 2.
- [vLLM] Kwon et al. 2023, "Efficient Memory Management for LLM Serving with
  PagedAttention" (arXiv:2309.06180), Sec. 3 (KV cache bytes per token).
- [GQA] Ainslie et al. 2023 (arXiv:2305.13245): K/V have `kv_heads` < `attention_heads`.
- [LoRA] Hu et al. 2021 (arXiv:2106.09685), Sec. 4: ΔW = B·A with rank r.
- [QLoRA] Dettmers et al. 2023 (arXiv:2305.14314), Sec. 3: NF4 with double quantization.
- [GPTQ] Frantar et al. 2022 (arXiv:2210.17323) / AWQ: 4-bit weights, one fp16 scale and
  a 4-bit zero point per group of 128.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from aicluster.planner.hardware import ModelShape
from aicluster.planner.optimizers import (
    MASTER_BYTES,
    default_master_weights,
    optimizer_state_bytes,
    paged,
)

PRECISIONS = ("fp32", "bf16", "fp16", "fp8", "int8", "int4", "nf4")

# Bits per quantized weight including its group constants:
#   int4: 4 + (16-bit scale + 4-bit zero) / 128 per group  [GPTQ, AWQ]
#   nf4:  4 + 0.127 (double-quantized constants, block 64)  [QLoRA Sec. 3]
WEIGHT_BITS = {
    "fp32": 32.0,
    "bf16": 16.0,
    "fp16": 16.0,
    "fp8": 8.0,
    "int8": 8.0,
    "int4": 4.0 + 20.0 / 128,
    "nf4": 4.0 + 0.127,
}
# Mixed-precision Adam: fp32 master weights, momentum and variance = K = 12 bytes per
# parameter on top of 2 (fp16/bf16 weights) + 2 (gradients) -> 16Ψ.  [ZeRO Sec. 3.1]
ADAM_K = 12
WEIGHT_BYTES_TRAIN = 2
GRAD_BYTES_TRAIN = 2


def bytes_per_param(precision: str) -> float:
    return WEIGHT_BITS[precision] / 8


# --- parameter counts --------------------------------------------------------------


@dataclass(frozen=True)
class ParamCounts:
    """Where a model's parameters are. `mlp` counts every expert; `mlp_active` those used per
    token; `routed` the routed experts' weights (what expert parallelism shards) and
    `routed_active` the routed share one token uses."""

    embedding: float
    lm_head: float
    attention: float
    mlp: float
    mlp_active: float
    norms: float
    routed: float = 0.0
    routed_active: float = 0.0

    @property
    def total(self) -> float:
        return self.embedding + self.lm_head + self.attention + self.mlp + self.norms

    @property
    def active(self) -> float:
        return self.embedding + self.lm_head + self.attention + self.mlp_active + self.norms

    @property
    def non_embedding(self) -> float:
        """All but the input embedding and the LM head, as model cards count "non-embedding"
        parameters (Qwen2.5-7B: 7.61B, non-embedding 6.53B; Gemma 3 report Table 1)."""
        return self.total - self.embedding - self.lm_head

    @property
    def linear(self) -> float:
        """Weights of the transformer blocks' matmuls (what quantization shrinks)."""
        return self.attention + self.mlp


def _attention_per_layer(m: ModelShape) -> tuple[float, float]:
    """(matmul weights, norm weights) of one attention block.

    Standard/GQA: h·(a·d) [Q] + 2·h·(kv·d) [K, V] + (a·d)·h [O].
    MLA (DeepSeek-V2, arXiv:2405.04434, Sec. 2.1.2; V3 config.json): queries h·q_r + q_r·a·(d_nope
    + d_rope) through the q_lora_rank bottleneck q_r (or h·a·(d_nope + d_rope) without it);
    the joint KV down-projection h·(c + d_rope) (latent c = kv_lora_rank plus the shared RoPE
    key); its up-projection c·a·(d_nope + d_v); the output a·d_v·h; RMSNorms on both latents.
    """
    h, a = m.hidden_size, m.attention_heads
    if not m.mla:
        q_out, kv_out = a * m.d_head, m.n_kv_heads * m.d_head
        return h * q_out + 2 * h * kv_out + q_out * h, 0.0
    c, q_r = m.kv_lora_rank or 0, m.q_lora_rank or 0
    nope = m.qk_nope_head_dim or m.d_head
    q = h * q_r + q_r * a * m.qk_dim if q_r else h * a * m.qk_dim
    kv = h * (c + m.rope_dim) + c * a * (nope + m.v_dim)
    return q + kv + a * m.v_dim * h, float(q_r + c)


@functools.lru_cache(maxsize=512)
def param_counts(m: ModelShape) -> ParamCounts:
    """Parameters of a Llama/GPT-style decoder from its config.

    Per layer: attention (`_attention_per_layer`: Q, K, V, O; GQA; or MLA);
    MLP = 3·h·f when gated (SwiGLU: gate, up, down; Shazeer 2020) else 2·h·f;
    MoE layers: `experts` routed MLPs and `shared_experts` shared ones of the expert size,
    plus a router of h·experts; the first `dense_layers` layers keep a dense MLP
    (DeepSeek-V3: 3 dense layers, 58 MoE layers of 256 routed + 1 shared experts of 2048);
    two RMSNorms of h. Embedding V·h, plus an LM head V·h unless tied, plus a final norm h.
    Checks: Llama-2-7B gives 6,738,415,616 and Llama-3-8B 8,030,261,248 (HF checkpoints).
    Biases and learned position embeddings (GPT, OPT) are not counted; set `params`.
    """
    h, L = m.hidden_size, m.layers
    attn_layer, latent_norms = _attention_per_layer(m)
    attention = L * attn_layer
    width = 3 if m.gated_mlp else 2
    dense_mlp = width * h * m.d_ff
    routed = routed_active = 0.0
    if m.is_moe:
        expert = width * h * m.expert_d_ff
        moe_layers = m.moe_layers
        routed = moe_layers * m.experts * expert
        routed_active = moe_layers * min(m.active_experts, m.experts) * expert
        shared = moe_layers * m.shared_experts * expert
        router = moe_layers * h * m.experts
        mlp = (L - moe_layers) * dense_mlp + routed + shared + router
    else:
        mlp = L * dense_mlp
    mlp_active = mlp - routed + routed_active
    embedding = m.vocab_size * h
    lm_head = 0 if m.tied_embeddings else m.vocab_size * h
    norms = L * (2 * h + latent_norms) + h
    counts = ParamCounts(
        embedding, lm_head, attention, mlp, mlp_active, norms, routed, routed_active
    )
    if m.params:  # published total overrides the shape; scale the block weights to match
        extra = m.params - counts.total
        scale = 1 + extra / counts.linear if counts.linear else 1
        counts = ParamCounts(
            embedding,
            lm_head,
            attention * scale,
            mlp * scale,
            mlp_active * scale,
            norms,
            routed * scale,
            routed_active * scale,
        )
    return counts


# --- inference ---------------------------------------------------------------------


def weight_bytes(m: ModelShape, precision: str) -> float:
    """Bytes of the weights at `precision`.

    fp32/bf16/fp16: every parameter at that width (Ψ·4 or Ψ·2 bytes; e.g. the Llama-2-7b-hf
    bf16 safetensors are 13.48 GB = 6.74e9 x 2). Quantized formats (fp8, int8, int4, nf4)
    shrink the block matmuls only; embeddings, LM head and norms stay 16-bit, as vLLM,
    GPTQ and AWQ checkpoints keep them.
    """
    c = param_counts(m)
    if precision in ("fp32", "bf16", "fp16"):
        return c.total * bytes_per_param(precision)
    other = c.total - c.linear
    return c.linear * bytes_per_param(precision) + other * 2


def active_weight_bytes(m: ModelShape, precision: str) -> float:
    """Bytes of the weights one token reads (an MoE reads only its active experts)."""
    total = weight_bytes(m, precision)
    c = param_counts(m)
    if c.mlp == c.mlp_active or c.mlp == 0:
        return total
    return total - (c.mlp - c.mlp_active) * bytes_per_param(precision)


def kv_bytes_per_token(m: ModelShape, kv_precision: str = "bf16") -> float:
    """KV cache bytes for one token: 2 (K and V) x L x kv_heads x head_dim x bytes.

    [vLLM Sec. 3]: OPT-13B needs 2 x 5120 x 40 x 2 B = 800 KB per token. With [GQA],
    Llama-3-8B needs 2 x 32 x 8 x 128 x 2 B = 128 KiB per token. MLA caches one latent per
    layer instead of per-head K and V: L x (kv_lora_rank + qk_rope_head_dim) x bytes
    (DeepSeek-V2, arXiv:2405.04434, Table 1: (d_c + d_h^R)·l elements; DeepSeek-V3:
    61 x (512 + 64) x 2 B = 70,272 B per bf16 token).
    """
    if m.mla:
        return m.layers * ((m.kv_lora_rank or 0) + m.rope_dim) * bytes_per_param(kv_precision)
    return 2 * m.layers * m.n_kv_heads * m.d_head * bytes_per_param(kv_precision)


def kv_tokens(m: ModelShape, context: float) -> float:
    """Tokens whose K/V one sequence of `context` tokens keeps, averaged over the layers:
    all of them, or at most the attention window in sliding-window layers. Sliding-window
    attention (Mistral 7B, arXiv:2310.06825 Sec. 2, "rolling buffer cache") attends to the
    last W tokens only, so such a layer never holds more than W. With
    `sliding_window_pattern` p only L - L//p layers are local (Gemma 2, arXiv:2408.00118
    Sec. 2: local and global layers alternate; Gemma 3: 5 local per global), the rest keep
    the whole context: (global x context + local x min(context, W)) / L."""
    if not m.sliding_window:
        return context
    local = min(context, m.sliding_window)
    g = m.global_layers
    return (g * context + (m.layers - g) * local) / m.layers


def kv_bytes_per_sequence(m: ModelShape, context: float, kv_precision: str = "bf16") -> float:
    """KV cache bytes of one sequence: bytes per token x kv_tokens(context).
    Mistral 7B, fp16, 32k context, 4096 window: 131,072 B x 4096 = 512 MiB (not 4 GiB)."""
    return kv_bytes_per_token(m, kv_precision) * kv_tokens(m, context)


# --- training ----------------------------------------------------------------------

STRATEGIES = ("ddp", "zero1", "zero2", "zero3")


@dataclass(frozen=True)
class TrainingMemory:
    """Bytes per GPU by kind; `total` includes the fixed runtime overhead. `host` is what
    offload or paged optimizer states keep in CPU memory per GPU (not in `total`)."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    overhead: float
    host: float = 0.0

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.overhead

    def as_dict(self) -> dict[str, float]:
        return {
            "weights": self.weights,
            "gradients": self.gradients,
            "optimizer": self.optimizer,
            "activations": self.activations,
            "overhead": self.overhead,
            "total": self.total,
            "host": self.host,
        }


@dataclass(frozen=True)
class ModelState:
    """Model-state bytes per GPU (`optimizer` includes fp32 master weights) and per GPU in
    host memory (`host`: offloaded or paged)."""

    weights: float
    gradients: float
    optimizer: float
    host: float = 0.0


def model_state(
    trainable: float,
    frozen: float,
    strategy: str,
    dp: int,
    mp: int = 1,
    frozen_bits: float = 16.0,
    *,
    frozen_16bit: float = 0.0,
    optimizer: str = "adamw",
    master_weights: bool | None = None,
    offload: bool = False,
    factored: float | None = None,
) -> ModelState:
    """Weights, gradients, optimizer (+ master) bytes per GPU; see `optimizers` for the
    per-parameter figures. [ZeRO Sec. 5.1-5.3] with Ψ = trainable/mp per model-parallel
    rank, Nd = dp, for mixed-precision AdamW (K = 12):
      ddp:   2Ψ + 2Ψ + 12Ψ            = 16Ψ
      zero1: 2Ψ + 2Ψ + 12Ψ/Nd         (P_os)
      zero2: 2Ψ + (2Ψ + 12Ψ)/Nd       (P_os+g)
      zero3: (2Ψ + 2Ψ + 12Ψ)/Nd       (P_os+g+p; = FSDP FULL_SHARD)
    Frozen weights (LoRA's base model) add frozen·bits/8 + frozen_16bit·2, sharded only by
    zero3: QLoRA quantizes the block matmuls (`frozen`) and keeps embeddings, LM head and
    norms (`frozen_16bit`) in 16 bits, as bitsandbytes does (it replaces nn.Linear layers
    only and skips the output head). Offload moves master + states + gradients to the host
    [ZeRO-Offload]; a paged optimizer's states are counted on the host.
    """
    psi = trainable / mp
    master = default_master_weights(optimizer) if master_weights is None else master_weights
    w, g = WEIGHT_BYTES_TRAIN * psi, GRAD_BYTES_TRAIN * psi
    states = optimizer_state_bytes(optimizer, psi, None if factored is None else factored / mp)
    m = MASTER_BYTES * psi if master else 0.0
    if strategy in ("zero1", "zero2", "zero3"):
        states, m = states / dp, m / dp
    if strategy in ("zero2", "zero3"):
        g /= dp
    if strategy == "zero3":
        w /= dp
    base = frozen / mp * frozen_bits / 8 + frozen_16bit / mp * 2
    if strategy == "zero3":
        base /= dp
    host = 0.0
    if offload:
        host, states, m, g = states + m + g, 0.0, 0.0, 0.0
    elif paged(optimizer):
        host, states = states, 0.0
    return ModelState(w + base, g, states + m, host)


def model_state_bytes(
    trainable: float,
    frozen: float,
    strategy: str,
    dp: int,
    mp: int = 1,
    frozen_bits: float = 16.0,
) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per GPU under mixed-precision AdamW (16Ψ)."""
    s = model_state(trainable, frozen, strategy, dp, mp, frozen_bits)
    return s.weights, s.gradients, s.optimizer


def activation_bytes(
    m: ModelShape,
    seq: int,
    micro_batch: int,
    tp: int = 1,
    checkpointing: str = "selective",
    cp: int = 1,
) -> float:
    """Activation memory per GPU for one micro-batch in flight, 16-bit activations.

    [SP Eq. 1-2, Table 2], per layer with tensor + sequence parallelism t:
      none:      s·b·h·(34 + 5·a·s/h) / t   (stores the a·s² attention scores)
      selective: s·b·h·34 / t               (scores recomputed; FlashAttention never stores them)
      full:      s·b·h·2 / t per layer, plus one layer's 34·s·b·h/t while it is recomputed.
    With 1F1B pipelining the first stage holds p micro-batches of L/p layers = L layers'
    worth [SP Sec. 4.2], so the per-GPU figure uses all L layers over t.
    Context parallelism `cp` splits the sequence: every rank holds s/cp tokens' activations
    ("the activation memory footprint per GPU is CP times smaller", Megatron-LM context
    parallel docs); stored scores are then (s/cp) x s per head.
    The 34 is derived for GPT-style blocks (MHA, 4h MLP); Llama-style blocks land close.
    Plus the logits for the loss: s·b·V·(2 + 4)/t (bf16 logits and their fp32 copy; assumption).
    """
    s, b, h, a, L = seq / cp, micro_batch, m.hidden_size, m.attention_heads, m.layers
    sbh = s * b * h
    if checkpointing == "none":  # scores are s x min(s, window) with sliding-window attention
        per_layer = sbh * (34 + 5 * a * kv_tokens(m, seq) / h)
        layers = L * per_layer
    elif checkpointing == "full":
        layers = L * 2 * sbh + 34 * sbh
    else:
        layers = L * 34 * sbh
    logits = s * b * m.vocab_size * 6
    return (layers + logits) / tp


LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_TARGETS = {
    "all": LORA_MODULES,  # every linear layer of the blocks [QLoRA Sec. 4]
    "attention": LORA_MODULES[:4],  # Q, K, V, O
    "qv": ("q_proj", "v_proj"),  # LoRA's own setting: W_q and W_v [LoRA Sec. 4.2, 7.1]
}
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")


def lora_modules(targets: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Module names (Hugging Face Llama names) a `lora_targets` value adapts."""
    if isinstance(targets, str):
        return LORA_TARGETS[targets]
    return tuple(targets)


Matrices = list[tuple[int, int, float]]  # (d_in, d_out, copies in the whole model)


def _module_dims(m: ModelShape, routed_only: bool = False) -> dict[str, Matrices]:
    """The matrices each linear module name stands for: (d_in, d_out, copies over all
    layers). A non-gated MLP has no gate_proj (up = c_fc, down = c_proj); MoE layers have
    one MLP of the expert size per routed and shared expert, dense layers one of
    intermediate_size. MLA: q_proj is q_a_proj + q_b_proj (or one q_proj without a query
    bottleneck), k_proj stands for kv_a_proj_with_mqa and v_proj for kv_b_proj (PEFT's
    names for DeepSeek). `routed_only`: the routed experts' matrices alone."""
    h, L, a = m.hidden_size, m.layers, m.attention_heads
    dims: dict[str, Matrices] = {}
    if not routed_only:
        if m.mla:
            c, q_r = m.kv_lora_rank or 0, m.q_lora_rank or 0
            nope = m.qk_nope_head_dim or m.d_head
            dims["q_proj"] = (
                [(h, q_r, L), (q_r, a * m.qk_dim, L)] if q_r else [(h, a * m.qk_dim, L)]
            )
            dims["k_proj"] = [(h, c + m.rope_dim, L)]
            dims["v_proj"] = [(c, a * (nope + m.v_dim), L)]
            dims["o_proj"] = [(a * m.v_dim, h, L)]
        else:
            q_out, kv_out = a * m.d_head, m.n_kv_heads * m.d_head
            dims["q_proj"] = [(h, q_out, L)]
            dims["k_proj"] = [(h, kv_out, L)]
            dims["v_proj"] = [(h, kv_out, L)]
            dims["o_proj"] = [(q_out, h, L)]
    moe_layers = m.moe_layers
    f_e = m.expert_d_ff
    experts = m.experts if routed_only else m.experts + m.shared_experts
    mlps: list[tuple[int, float]] = [] if routed_only else [(m.d_ff, L - moe_layers)]
    if moe_layers:
        mlps.append((f_e, moe_layers * experts))
    mlps = [(f, n) for f, n in mlps if n]
    names = MLP_MODULES if m.gated_mlp else MLP_MODULES[1:]
    for name in names:
        dims[name] = [(f, h, n) if name == "down_proj" else (h, f, n) for f, n in mlps]
    return dims


def lora_params(
    m: ModelShape,
    rank: int,
    targets: str | tuple[str, ...] | list[str] = "all",
    routed_only: bool = False,
) -> float:
    """Trainable LoRA parameters: r·(d_in + d_out) per adapted matrix [LoRA Sec. 4].

    `targets`: `all` (Q, K, V, O and the MLP matrices of every expert, as QLoRA recommends
    [QLoRA Sec. 4]), `attention` (Q, K, V, O), `qv` (W_q and W_v, LoRA's own setting), or
    a list of module names from LORA_MODULES. Checks: GPT-3 175B with r = 1 and r = 8 on
    W_q, W_v gives 4.7M and 37.7M [LoRA Table 4]; Llama 2 7B with r = 8 on q_proj, v_proj
    gives 4,194,304 (PEFT's print_trainable_parameters). `routed_only`: the adapters of
    the routed experts alone (what expert parallelism shards).
    """
    dims = _module_dims(m, routed_only)
    return rank * sum(
        (d_in + d_out) * n for t in lora_modules(targets) for d_in, d_out, n in dims.get(t, ())
    )


def adafactor_state_values(
    m: ModelShape,
    trainable_lora: bool = False,
    rank: int = 0,
    targets: str | tuple[str, ...] | list[str] = "all",
) -> float:
    """fp32 values Adafactor's factored second moment keeps [Adafactor Sec. 3]: n + m per
    n x m matrix, the full size of every vector.

    Full training: every block matrix (= lora_params with rank 1 over all modules), the
    embedding and LM head (V + h each) and the norms. LoRA: A (r x d_in) and B (d_out x r)
    of each adapted matrix, i.e. d_in + d_out + 2r.
    """
    if trainable_lora:
        dims = _module_dims(m)
        n = sum(c for t in lora_modules(targets) for _, _, c in dims.get(t, ()))
        return lora_params(m, 1, targets) + n * 2 * rank
    h, V = m.hidden_size, m.vocab_size
    heads = 1 if m.tied_embeddings else 2
    return lora_params(m, 1, "all") + heads * (V + h) + m.layers * 2 * h + h
