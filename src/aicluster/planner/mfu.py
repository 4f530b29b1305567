"""Model FLOPs utilisation (MFU) by model size and GPU class, from published training runs.

MFU = model FLOPs / (wall time x GPUs x dense bf16 peak), with model FLOPs as `training`
counts them (6·N without the input embedding, plus causal attention) and wall time the
productive time: the published GPU hours divided by the goodput (`Assumptions.goodput`).
Units: fractions of peak; parameter counts in parameters.

Invariants:
- Each table row is one published run: GPU hours, tokens and context from the report, the
  FLOPs recomputed by the planner, so a row reproduces its run's GPU hours exactly when the
  default goodput is used (tests check each within 10%).
- Between rows MFU is interpolated linearly in log10(params); outside, the nearest row.
- A GPU whose dense bf16 peak is above 400 TFLOP/s (Hopper, Blackwell, MI300X) uses the H100
  rows; below (Ampere, Ada: A100 312, L40S 362, L4 121) the A100 rows. Small models reach a
  lower MFU on the faster chips: their matmuls are too small to keep the tensor cores busy.
- Parallelism is not a separate axis: the rows are large data + tensor + pipeline parallel
  runs (thousands of GPUs); a run on a few GPUs is planned with the same figures, which is
  conservative for it. `constraints.mfu` overrides the table.

Sources:
- [L2] Touvron et al. 2023, "Llama 2: Open Foundation and Fine-Tuned Chat Models"
  (arXiv:2307.09288), Table 2 and Sec. 2.2.1: A100-80GB; 2.0T tokens, 4k context; 7B
  184,320, 13B 368,640, 70B 1,720,320 GPU hours.
- [L31] Meta Llama 3.1 model card (https://github.com/meta-llama/llama-models/blob/main/
  models/llama3_1/MODEL_CARD.md): H100-80GB; 15T+ tokens, 8k pre-training context; 8B
  1.46M, 70B 7.0M, 405B 30.84M GPU hours.
- Cross-check: Dubey et al. 2024, "The Llama 3 Herd of Models" (arXiv:2407.21783) Table 4
  reports 38-43% BF16 MFU for 405B on 8,192-16,384 H100s (the 405B row here: 0.40).
"""

from __future__ import annotations

import math

HOPPER_CLASS_TFLOPS = 400.0

# (total params, MFU) per GPU class; MFU derived from the cited GPU hours as described above
# (see tests/unit/test_planner_time.py for the derivation of each figure).
MFU_TABLE: dict[str, tuple[tuple[float, float], ...]] = {
    "a100": (
        (6.74e9, 0.46),  # Llama 2 7B [L2]
        (13.0e9, 0.44),  # Llama 2 13B [L2]
        (69.0e9, 0.49),  # Llama 2 70B [L2]
    ),
    "h100": (
        (8.03e9, 0.165),  # Llama 3.1 8B [L31]
        (70.6e9, 0.30),  # Llama 3.1 70B [L31]
        (405.9e9, 0.40),  # Llama 3.1 405B [L31] (15.6T tokens); Llama 3 paper: 38-43%
    ),
}


def gpu_class(bf16_tflops: float) -> str:
    return "h100" if bf16_tflops > HOPPER_CLASS_TFLOPS else "a100"


def table_mfu(params: float, bf16_tflops: float) -> float:
    """MFU for a model of `params` parameters on a GPU of `bf16_tflops` dense peak."""
    rows = MFU_TABLE[gpu_class(bf16_tflops)]
    x = math.log10(max(params, 1.0))
    if x <= math.log10(rows[0][0]):
        return rows[0][1]
    for (p0, m0), (p1, m1) in zip(rows, rows[1:], strict=False):
        x0, x1 = math.log10(p0), math.log10(p1)
        if x <= x1:
            return m0 + (m1 - m0) * (x - x0) / (x1 - x0)
    return rows[-1][1]
