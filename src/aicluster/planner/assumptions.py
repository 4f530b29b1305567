"""The planner's tunable assumptions, with their defaults and where each default comes from.

Every one can be set in a plan spec under `constraints`; the report prints them all so a
figure is never the product of a hidden constant.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

HOURS_PER_MONTH = 730.0  # 8760 h / 12
BTU_PER_HOUR_PER_WATT = 3.412142  # NIST SP 811, Appendix B.8: 1 W = 3.412 142 BTU_IT/h
MATMUL_EFFICIENCY = 0.6
"""Share of the datasheet's dense bf16 TFLOPS a large (8192^2) GEMM of a healthy GPU reaches
at least: an assumption (vendor GEMM benchmarks are well above it on healthy GPUs, and a
throttled or mis-clocked GPU falls far below). `aicluster doctor --expect` judges its
gpu_matmul against it; `aicluster plan --calibrate` scales MFU by a GPU's shortfall from it."""


@dataclass(frozen=True)
class Assumptions:
    mfu: float | None = None
    """Model FLOPs utilisation for training; None: by model size and GPU class from published
    runs (`aicluster.planner.mfu`: Llama 2 on A100 0.44-0.49, Llama 3.1 on H100 0.17 (8B) to
    0.41 (405B)). PaLM 540B reached 46.2% (Chowdhery et al. 2022, Table 3)."""
    mfu_scale: float = 1.0
    """Multiplies the MFU (`mfu` or the table), at most 1: `aicluster plan --calibrate`
    sets it to a GPU's measured bf16 matmul over the healthy floor (`MATMUL_EFFICIENCY`)
    when the GPU falls short of it (`aicluster.planner.calibrate`)."""
    goodput: float = 0.90
    """Share of wall-clock time a training run makes progress (the rest: failures, restarts,
    evaluation). Llama 3 405B: "higher than 90% effective training time" over a 54-day
    snapshot with 466 interruptions (Dubey et al. 2024, arXiv:2407.21783, Sec. 3.3.4)."""
    prefill_efficiency: float = 0.50
    """Fraction of peak tensor FLOP/s a prefill reaches (compute-bound; assumption)."""
    bandwidth_efficiency: float = 0.80
    """Fraction of HBM bandwidth a decode step reaches (memory-bound; assumption, typical
    of vendor-reported STREAM-like figures of 80-90%)."""
    network_efficiency: float = 0.80
    """Fraction of line rate an all-reduce reaches (NCCL bus bandwidth; assumption)."""
    nvlink_efficiency: float = 0.80
    """Fraction of NVLink (or PCIe) per-direction bandwidth a tensor-parallel all-reduce
    reaches (assumption, as `network_efficiency`)."""
    allreduce_latency_us: float = 22.0
    """Fixed cost (alpha) of one tensor-parallel all-reduce among 4 GPUs, microseconds;
    `allreduce_latency_per_doubling_us` more for each doubling of the ranks (less for 2).
    Fitted to NVIDIA's NeMo Llama 2 7B latencies on H100 at TP 1/2/4/8 (batch 1, 128 in / 20
    out: 153.8, 128.6, 107.4, 97.6 ms; docs.nvidia.com/nemo-framework/user-guide/latest/
    performance/llama.html): what TP 2, 4 and 8 save per step against the halved weight read
    gives 19.6, 22.7 and 24.9 us per all-reduce (64 per step)."""
    allreduce_latency_per_doubling_us: float = 2.6
    """What each doubling of an all-reduce's ranks adds to its alpha, microseconds. Small
    all-reduces are latency-bound and tree / recursive-doubling algorithms take log2(t)
    rounds (Thakur, Rabenseifner & Gropp 2005, "Optimization of collective communication
    operations in MPICH", IJHPCA 19(1); NCCL's tree all-reduce), so alpha(t) = alpha(4) +
    this x (log2 t - 2): 19.4, 22.0, 24.6 us at t = 2, 4, 8, the NeMo sweep's 19.6, 22.7,
    24.9 within 1 us (one alpha for all t was 12% off at TP 2)."""
    step_overhead_per_layer_us: float = 21.9
    """Fixed cost of a forward step per layer (kernel launches, synchronisation),
    microseconds: fitted to NVIDIA NIM's Llama 3.3 70B fp8 TP2 on 2 x H100 at concurrency 1
    (5000 in / 500 out, ITL 18.58 ms; docs.nvidia.com/nim/benchmarking/llm/1.0.0/performance)
    once the weight read (13.56 ms), the KV read and 160 all-reduces at TP 2's alpha
    (3.11 ms) are charged: 1.75 ms / 80 layers."""
    step_overhead_us: float = 0.0
    """Fixed cost of a forward step independent of the layers (the engine's scheduling,
    input preparation and sampling on the CPU), microseconds. 0: the per-layer figure above,
    fitted to NIM (TensorRT-LLM), holds it all. Python-scheduled engines pay more per step:
    vLLM's nightly latency benchmark (buildkite.com/vllm/performance-benchmark/builds/9515,
    H200, batch 8, 32 in / 128 out) implies 1,570 us on its Llama 3.1 8B TP1 run, which then
    puts its Llama 3 70B TP4 and Mixtral 8x7B TP2 runs within 3% (tests/unit/
    test_planner_moe_serving.py); set it for such a stack."""
    gpu_memory_utilization: float = 0.90
    """Share of GPU memory an inference engine may use: vLLM's default
    `gpu_memory_utilization=0.9` (vLLM engine arguments documentation)."""
    runtime_overhead_gib: float = 2.0
    """Per-GPU memory a training process needs beyond its tensors: CUDA context, kernel
    workspaces, NCCL buffers (assumption)."""
    engine_non_torch_gib: float = 1.8
    """Serving: memory an engine holds outside PyTorch tensors (CUDA context, cuBLAS
    workspaces) per GPU. vLLM's memory profile of Llama 3 8B on one H100: non_torch_memory
    1.79 GiB (vLLM PR #10511, github.com/vllm-project/vllm/pull/10511)."""
    engine_tp_buffers_gib: float = 1.8
    """Serving: extra per-GPU memory with tensor parallelism (NCCL and custom all-reduce
    buffers): the same profile at TP 2 shows non_torch_memory 3.58 GiB (vLLM PR #10511)."""
    max_num_batched_tokens: int = 8192
    """Serving: tokens in the engine's largest forward (the activation profile run): vLLM's
    default with a model of 8k context or more."""
    max_num_seqs: int = 256
    """Most sequences an engine batches at once: vLLM's default `max_num_seqs=256`."""
    utilization: float = 0.70
    """Target load of a replica at the planned request rate; the rest is burst headroom."""
    pue: float = 1.3
    """Power usage effectiveness of the facility (Uptime Institute 2023 survey: 1.58 average;
    1.3 is a modern facility; assumption)."""
    electricity_usd_per_kwh: float = 0.15
    """Electricity price (assumption; set your tariff)."""
    rack_power_kw: float = 17.0
    """Power available per rack (assumption; common air-cooled racks are 10-20 kW)."""
    amortization_months: int = 36
    """Months over which hardware is written off (assumption: 3-year depreciation)."""
    checkpoint_interval_minutes: float = 60.0
    """Time between training checkpoints (assumption)."""

    def collective_latency_s(self, ranks: int) -> float:
        """alpha of one collective among `ranks` GPUs, seconds (0 for one GPU):
        allreduce_latency_us + allreduce_latency_per_doubling_us x (log2(ranks) - 2)."""
        if ranks <= 1:
            return 0.0
        us = self.allreduce_latency_us + self.allreduce_latency_per_doubling_us * (
            math.log2(ranks) - 2
        )
        return max(0.0, us) * 1e-6

    def as_dict(self) -> dict:
        return asdict(self)
