"""Training time: MFU by model size and GPU class, goodput, against published GPU hours.

Each calibration point: published GPU hours (source cited), the planner's GPU hours with
its defaults (MFU table, goodput 0.9), and the tolerance. Planner GPU hours are
compute_bound_seconds x GPUs / 3600 (independent of the GPU count chosen).
"""

from __future__ import annotations

import pytest

from aicluster.planner.assumptions import Assumptions
from aicluster.planner.catalog import load_catalog
from aicluster.planner.hardware import ModelShape
from aicluster.planner.mfu import table_mfu
from aicluster.planner.training import TrainRequest, plan_training

CAT = load_catalog()
A = Assumptions()  # the defaults: MFU from the table, goodput 0.9
LLAMA2 = "Touvron et al. 2023, Llama 2 (arXiv:2307.09288) Table 2"
LLAMA31 = "Llama 3.1 model card, github.com/meta-llama/llama-models models/llama3_1/MODEL_CARD.md"


def gpu_hours(model, gpu: str, tokens: float, seq: int, gpus: int = 2048) -> float:
    m = model if isinstance(model, ModelShape) else CAT.get("models", model)
    r = TrainRequest(
        name="t",
        model=m,
        gpu=CAT.get("gpus", gpu),
        gpus_per_node=8,
        node_network_gb_s=8 * 50.0,
        tokens=tokens,
        sequence_length=seq,
        gpus=gpus,
    )
    p = plan_training(r, A)
    return p.compute_bound_seconds * p.gpus / 3600


@pytest.mark.parametrize(
    ("model", "gpu", "tokens", "seq", "published", "source"),
    [
        ("llama-2-7b", "a100-80gb-sxm", 2e12, 4096, 184_320, LLAMA2),
        ("llama-2-13b", "a100-80gb-sxm", 2e12, 4096, 368_640, LLAMA2),
        ("llama-2-70b", "a100-80gb-sxm", 2e12, 4096, 1_720_320, LLAMA2),
        ("llama-3.1-8b", "h100-sxm", 15e12, 8192, 1.46e6, LLAMA31),
        ("llama-3.1-70b", "h100-sxm", 15e12, 8192, 7.0e6, LLAMA31),
        # 405B: 15.6T tokens (Dubey et al. 2024, arXiv:2407.21783, Sec. 3.2.1)
        ("llama-3.1-405b", "h100-sxm", 15.6e12, 8192, 30.84e6, LLAMA31),
    ],
)
def test_calibration_runs_gpu_hours(model, gpu, tokens, seq, published, source):
    # the MFU table's rows: each run's GPU hours within 10% (rounding of the table only)
    assert gpu_hours(model, gpu, tokens, seq) == pytest.approx(published, rel=0.10), source


def test_held_out_llama_2_34b_gpu_hours():
    # Not a table row: Llama 2 34B, 1,038,336 A100 GPU hours for 2.0T tokens (LLAMA2, Table 2).
    # Shape as Code Llama 34B's config.json: 48 layers, 8192 hidden, 64 heads, 8 KV heads,
    # 22016 intermediate, 32000 vocabulary. Planner: 0.889M (-14%), the one training point
    # outside the 10% goal, kept as a held-out check (no constant is tuned to it).
    # Why: the 34B is the one Llama 2 run on the other cluster. The paper (Sec. 2.2.1)
    # trained on Meta's RSC (InfiniBand, GPUs capped at 400 W) and on production clusters
    # (RoCE, 350 W cap), and Table 2 gives 350 W for the 34B alone (its carbon column
    # agrees: tCO2eq / (hours x W) is one intensity for all four rows only with 350 W for
    # the 34B). The table rows (7B, 13B, 70B) are all 400 W runs. The planner has no power cap or RoCE axis and no published figure for what a
    # 350 W cap costs an A100 in training, so the gap is documented, not modelled. GQA does
    # not explain it: the 70B has it too, and the shape here has 8 KV heads.
    m = ModelShape(
        key="llama-2-34b",
        name="Llama 2 34B",
        layers=48,
        hidden_size=8192,
        attention_heads=64,
        kv_heads=8,
        intermediate_size=22016,
        vocab_size=32000,
    )
    hours = gpu_hours(m, "a100-80gb-sxm", 2e12, 4096)
    assert hours == pytest.approx(1_038_336, rel=0.15)
    assert hours / 1_038_336 - 1 == pytest.approx(-0.144, abs=0.005)


def test_llama_3_405b_mfu_is_in_the_published_range():
    # Dubey et al. 2024 (arXiv:2407.21783) Table 4: 38% to 43% BF16 MFU on 8,192-16,384 H100s.
    assert 0.38 <= table_mfu(405.9e9, 989.4) <= 0.43


def test_mfu_grows_with_size_on_h100_and_interpolates():
    h = [table_mfu(p, 989.4) for p in (1e9, 8.03e9, 30e9, 70.6e9, 405.9e9, 1e12)]
    assert h[0] == h[1] == 0.165  # below the smallest row: its value
    assert h[1] < h[2] < h[3] < h[4] == h[5] == 0.40
    assert table_mfu(8.03e9, 312) == pytest.approx(0.46, abs=0.01)  # A100 class


def test_goodput_default_and_override():
    # Llama 3 (arXiv:2407.21783) Sec. 3.3.4: "higher than 90% effective training time"
    assert A.goodput == 0.90
    base = gpu_hours("llama-2-7b", "a100-80gb-sxm", 2e12, 4096)
    r = TrainRequest(
        name="t",
        model=CAT.get("models", "llama-2-7b"),
        gpu=CAT.get("gpus", "a100-80gb-sxm"),
        gpus_per_node=8,
        node_network_gb_s=400.0,
        tokens=2e12,
        gpus=2048,
    )
    full = plan_training(r, Assumptions(goodput=1.0))
    assert full.compute_bound_seconds * 2048 / 3600 == pytest.approx(base * 0.9)
    assert plan_training(r, Assumptions(mfu=0.5)).mfu == 0.5  # constraints.mfu wins
