"""Optimizer state, master weights and CPU offload: bytes of training state per parameter.

Units: bytes per trainable parameter (float) unless the name says otherwise; Ψ (psi) is a
trainable parameter count. Weights and gradients are 16-bit (2 + 2 bytes per parameter) in
every setting here; what changes with the optimizer is the state it keeps, and whether an
fp32 master copy of the weights is kept for the update (mixed precision).

Invariants:
- `adamw` with master weights is ZeRO's mixed-precision Adam: K = 12 bytes (fp32 master 4 +
  momentum 4 + variance 4) on top of 2 + 2, so 16Ψ in all (Rajbhandari et al. 2020, "ZeRO:
  Memory Optimizations Toward Training Trillion Parameter Models", arXiv:1910.02054, Sec. 3.1).
- Optimizer states per parameter (Hugging Face Transformers docs, "Model training anatomy",
  https://huggingface.co/docs/transformers/model_memory_anatomy): 8 bytes for AdamW (two
  fp32 states), 2 bytes for 8-bit AdamW (bitsandbytes), 4 bytes for SGD with momentum.
- 8-bit states are block-wise quantized with one fp32 absmax per block of 2048 values
  (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization", arXiv:2110.02861,
  Sec. 2): 1 + 4/2048 bytes per value.
- Adafactor keeps no first moment (beta1 = None, its default) and factors the second moment
  of an n x m matrix into n + m fp32 values (Shazeer & Stern 2018, "Adafactor: Adaptive
  Learning Rates with Sublinear Memory Cost", arXiv:1804.04235, Sec. 3); vectors keep a
  full fp32 second moment.
- Paged optimizers (bitsandbytes `paged_adamw`, `paged_adamw_8bit`) keep their states in CUDA unified
  memory and page them to the host when the GPU runs short (bitsandbytes docs, "Paged
  optimizers"; Dettmers et al. 2023, QLoRA, arXiv:2305.14314, Sec. 3): the planner counts
  those states as host memory, not GPU memory.
- Offload (ZeRO-Offload, Ren et al. 2021, arXiv:2101.06840, Sec. 4): the fp32 master
  weights, optimizer states and gradients live in host memory and the update runs on the
  CPU; the GPU keeps the 16-bit weights (and streams gradients out in buckets).
"""

from __future__ import annotations

OPTIMIZERS = (
    "adamw",
    "adamw_bf16",
    "adamw_8bit",
    "paged_adamw",
    "paged_adamw_8bit",
    "sgd",
    "sgd_momentum",
    "adafactor",
)

WEIGHT_BYTES = 2.0  # 16-bit weights used in forward and backward
GRAD_BYTES = 2.0  # 16-bit gradients
MASTER_BYTES = 4.0  # fp32 master copy of the weights (mixed precision)
FP32 = 4.0
BLOCK_8BIT = 2048  # bitsandbytes block size for 8-bit optimizer states
BYTES_8BIT = 1.0 + FP32 / BLOCK_8BIT  # one byte per value + an fp32 absmax per block

# Per-parameter state for the element-wise optimizers (Adafactor is factored: see below).
STATE_BYTES = {
    "adamw": 2 * FP32,  # momentum + variance in fp32
    "adamw_bf16": 2 * 2.0,  # momentum + variance in bf16
    "adamw_8bit": 2 * BYTES_8BIT,
    "paged_adamw": 2 * FP32,  # bitsandbytes paged AdamW with 32-bit states (QLoRA's)
    "paged_adamw_8bit": 2 * BYTES_8BIT,
    "sgd": 0.0,
    "sgd_momentum": FP32,  # momentum buffer
}


def default_master_weights(optimizer: str) -> bool:
    """Whether an fp32 master copy is kept unless the spec says: yes for every optimizer but
    `adamw_bf16`, which stands for pure-bf16 training (weights, grads and states in bf16)."""
    return optimizer != "adamw_bf16"


def paged(optimizer: str) -> bool:
    return optimizer.startswith("paged_")


def optimizer_state_bytes(optimizer: str, trainable: float, factored: float | None = None) -> float:
    """Bytes of optimizer state for `trainable` parameters (no master weights).

    `factored`: for Adafactor, the count of fp32 values its factored second moment keeps
    (sum of n + m over matrices plus the vector parameters); required for `adafactor`.
    """
    if optimizer == "adafactor":
        if factored is None:
            raise ValueError("adafactor needs the factored state size")
        return FP32 * factored
    try:
        return STATE_BYTES[optimizer] * trainable
    except KeyError:
        raise ValueError(
            f"unknown optimizer {optimizer!r}; known: {', '.join(OPTIMIZERS)}"
        ) from None


def bytes_per_param(optimizer: str, master_weights: bool | None = None) -> float:
    """Weights + gradients + master + state bytes per trainable parameter (element-wise
    optimizers): adamw 16, adamw_bf16 8, adamw_8bit ~10, sgd 8, sgd_momentum 12."""
    master = default_master_weights(optimizer) if master_weights is None else master_weights
    return WEIGHT_BYTES + GRAD_BYTES + (MASTER_BYTES if master else 0.0) + STATE_BYTES[optimizer]
