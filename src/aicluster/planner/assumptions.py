"""The planner's tunable assumptions, with their defaults and where each default comes from.

Every one can be set in a plan spec under `constraints`; the report prints them all so a
figure is never the product of a hidden constant.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

HOURS_PER_MONTH = 730.0  # 8760 h / 12
BTU_PER_HOUR_PER_WATT = 3.412142  # NIST SP 811, Appendix B.8: 1 W = 3.412 142 BTU_IT/h


@dataclass(frozen=True)
class Assumptions:
    mfu: float = 0.40
    """Model FLOPs utilisation for training. PaLM 540B reached 46.2% (Chowdhery et al. 2022,
    Table 3); Llama 3 405B 38-43% (Dubey et al. 2024, Table 4). 40% is a planning value."""
    prefill_efficiency: float = 0.50
    """Fraction of peak tensor FLOP/s a prefill reaches (compute-bound; assumption)."""
    bandwidth_efficiency: float = 0.80
    """Fraction of HBM bandwidth a decode step reaches (memory-bound; assumption, typical
    of vendor-reported STREAM-like figures of 80-90%)."""
    network_efficiency: float = 0.80
    """Fraction of line rate an all-reduce reaches (NCCL bus bandwidth; assumption)."""
    gpu_memory_utilization: float = 0.90
    """Share of GPU memory an inference engine may use: vLLM's default
    `gpu_memory_utilization=0.9` (vLLM engine arguments documentation)."""
    runtime_overhead_gib: float = 2.0
    """Per-GPU memory for CUDA context, kernels workspace, NCCL buffers (assumption)."""
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

    def as_dict(self) -> dict:
        return asdict(self)
