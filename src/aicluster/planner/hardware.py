"""Planner vocabulary: GPUs, node shapes, interconnects, storage and model shapes.

These are plain, frozen records built from catalog data (dicts), so the arithmetic
does no I/O: `aicluster.planner.catalog` reads the shipped YAML and the spec's
overrides are merged into those dicts before the records are built here.

Units are fixed by the field name: `_gib` binary gigabytes, `_gb_s` decimal
gigabytes per second, `_tflops` 10^12 FLOP/s (dense, no sparsity), `_w` watts,
`_usd` US dollars. A record's `sources` maps a figure (or group) to where it
comes from; the planner never invents a hardware figure that is not in a record.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

GIB = 2**30
GB = 10**9


class CatalogError(ValueError):
    """A catalog entry is missing figures or has a bad one. `field` is dotted; `missing`
    lists every required field the entry lacks (all of them, in one error)."""

    def __init__(self, field: str, message: str, missing: tuple[str, ...] = ()):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.missing = missing


@dataclass(frozen=True)
class Gpu:
    key: str
    name: str
    memory_gib: float
    memory_bandwidth_gb_s: float
    bf16_tflops: float
    tdp_w: float
    fp8_tflops: float | None = None
    int8_tops: float | None = None
    fp32_tflops: float | None = None
    nvlink_gb_s: float | None = None  # total (both directions) per GPU; None: no NVLink
    pcie_gb_s: float = 32.0  # per direction, x16 link
    price_usd: float | None = None
    aliases: tuple[str, ...] = ()
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GIB

    def peak_flops(self, precision: str) -> float:
        """Dense tensor-core FLOP/s for matmuls in `precision` (falls back to bf16)."""
        # fp8 and int8 run W8A8 matmuls on the 8-bit tensor cores; int4 is weight-only
        # (AWQ/GPTQ kernels dequantize to 16-bit), so its matmuls run at bf16 rate.
        if precision == "fp8" and self.fp8_tflops:
            return self.fp8_tflops * 1e12
        if precision == "int8" and (self.int8_tops or self.fp8_tflops):
            return (self.int8_tops or self.fp8_tflops or 0) * 1e12
        if precision == "fp32" and self.fp32_tflops:
            return self.fp32_tflops * 1e12
        return self.bf16_tflops * 1e12


@dataclass(frozen=True)
class NodeShape:
    key: str
    name: str
    gpu: str  # catalog key of its GPU
    gpus: int
    power_w: float  # maximum system power
    cpus: int | None = None  # descriptive only: the planner never reads it
    memory_gib: float | None = None  # host memory; descriptive only
    nics: int = 1  # compute-fabric ports
    nvme_tb: float = 0.0
    nvme_read_gb_s: float = 3.0
    price_usd: float | None = None  # whole server; None: GPUs x price + base
    base_price_usd: float = 0.0  # server without GPUs, used when price_usd is None
    rack_units: int = 4
    sources: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Interconnect:
    key: str
    name: str
    kind: str  # pcie | nvlink | infiniband | ethernet
    gbit_s: float  # per port, per direction
    switch_ports: int = 64
    switch_power_w: float = 0.0
    switch_price_usd: float = 0.0
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def gb_s(self) -> float:
        """Bytes per second / 1e9 of one port, one direction."""
        return self.gbit_s / 8


@dataclass(frozen=True)
class Storage:
    key: str
    name: str
    read_gb_s: float  # aggregate, all clients together
    write_gb_s: float
    sources: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer (Llama/GPT family), optionally mixture-of-experts.

    `params`, when given, overrides the count computed from the shape (for models
    whose layers the shape cannot describe). `experts` > 1 means each MoE layer has
    `experts` routed MLPs of `moe_intermediate_size` (default `intermediate_size`, the
    Mixtral convention) of which `active_experts` run per token, plus `shared_experts`
    that every token runs (DeepSeek-V3: 256 routed, 8 active, 1 shared); the first
    `dense_layers` layers have a dense MLP of `intermediate_size` instead
    (DeepSeek-V3's first_k_dense_replace = 3).

    Attention: `sliding_window` with `sliding_window_pattern` p > 1 means every p-th layer
    attends globally and the others locally (Gemma 2: p = 2; Gemma 3: p = 6, the
    `sliding_window_pattern` of its config.json); without p every layer uses the window
    (Mistral 7B v0.1). `kv_lora_rank` marks multi-head latent attention (MLA, DeepSeek-V2
    arXiv:2405.04434 Sec. 2.1; V3): keys and values come from one cached latent of
    `kv_lora_rank` plus a shared RoPE key of `qk_rope_head_dim`, queries optionally through
    a `q_lora_rank` bottleneck; heads have `qk_nope_head_dim` + `qk_rope_head_dim` for
    scores and `v_head_dim` for values.
    """

    key: str
    name: str
    layers: int
    hidden_size: int
    attention_heads: int
    vocab_size: int
    kv_heads: int | None = None
    head_dim: int | None = None
    intermediate_size: int | None = None
    gated_mlp: bool = True
    experts: int = 1
    active_experts: int = 1
    shared_experts: int = 0
    moe_intermediate_size: int | None = None
    dense_layers: int = 0
    tied_embeddings: bool = False
    max_context: int | None = None
    sliding_window: int | None = None  # attention window (Mistral 7B v0.1: 4096); None: full
    sliding_window_pattern: int | None = None  # every p-th layer global (Gemma 2: 2, Gemma 3: 6)
    kv_lora_rank: int | None = None  # MLA latent (DeepSeek-V3: 512)
    q_lora_rank: int | None = None  # MLA query bottleneck (DeepSeek-V3: 1536)
    qk_rope_head_dim: int | None = None  # MLA decoupled RoPE key/query dims (DeepSeek-V3: 64)
    qk_nope_head_dim: int | None = None  # MLA per-head score dims without RoPE (V3: 128)
    v_head_dim: int | None = None  # MLA per-head value dims (V3: 128)
    params: float | None = None
    published_params: float | None = None
    sources: dict[str, str] = field(default_factory=dict, hash=False, compare=False)

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads or self.attention_heads

    @property
    def d_head(self) -> int:
        return self.head_dim or self.hidden_size // self.attention_heads

    @property
    def d_ff(self) -> int:
        if self.intermediate_size:
            return self.intermediate_size
        return 4 * self.hidden_size

    @property
    def is_moe(self) -> bool:
        return self.experts > 1

    @property
    def expert_d_ff(self) -> int:
        """Intermediate size of one expert (routed or shared)."""
        return self.moe_intermediate_size or self.d_ff

    @property
    def moe_layers(self) -> int:
        """Layers with routed experts (all but the leading dense ones); 0 for a dense model."""
        return max(0, self.layers - self.dense_layers) if self.is_moe else 0

    @property
    def mla(self) -> bool:
        return bool(self.kv_lora_rank)

    @property
    def rope_dim(self) -> int:
        return self.qk_rope_head_dim or 0

    @property
    def qk_dim(self) -> int:
        """Per-head width of queries and keys (MLA: no-RoPE + RoPE parts)."""
        if self.mla:
            return (self.qk_nope_head_dim or self.d_head) + self.rope_dim
        return self.d_head

    @property
    def v_dim(self) -> int:
        """Per-head width of values."""
        return (self.v_head_dim or self.d_head) if self.mla else self.d_head

    def attention_width(self, absorbed: bool = False) -> float:
        """heads x (score width + value width) / 2: the `H·Q` of the attention FLOPs (PaLM
        App. B's 12·L·H·Q·T for Q = K = V widths). MLA with the up-projections absorbed (how
        decoding runs it: DeepSeek-V2 Sec. 2.1.2, FlashMLA) scores against the
        kv_lora_rank + rope latent and mixes values in kv_lora_rank dims."""
        if self.mla and absorbed:
            return self.attention_heads * (2 * (self.kv_lora_rank or 0) + self.rope_dim) / 2
        return self.attention_heads * (self.qk_dim + self.v_dim) / 2

    def kv_shards(self, tp: int) -> int:
        """Tensor-parallel ranks the KV cache is split over: the KV heads (each replicated
        once tp exceeds them); MLA's latent has no heads, so every rank keeps all of it
        (why vLLM and SGLang serve DeepSeek with data-parallel attention)."""
        return 1 if self.mla else min(tp, self.n_kv_heads)

    @property
    def global_layers(self) -> int:
        """Layers that attend to the whole context (the rest use the sliding window)."""
        if not self.sliding_window:
            return self.layers
        if self.sliding_window_pattern and self.sliding_window_pattern > 1:
            return self.layers // self.sliding_window_pattern
        return 0

    def splits_heads(self, tp: int) -> bool:
        """Whether tensor parallelism `tp` splits the heads evenly, as vLLM and Megatron-LM
        require: attention heads divisible by tp, and KV heads divisible by tp or (each
        replicated on tp/kv ranks) dividing tp."""
        kv = self.n_kv_heads
        return self.attention_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)


_RECORDS: dict[str, type] = {
    "gpus": Gpu,
    "nodes": NodeShape,
    "interconnects": Interconnect,
    "storage": Storage,
    "models": ModelShape,
}
SECTIONS = tuple(_RECORDS)


def required_fields(section: str) -> tuple[str, ...]:
    """The fields an entry of `section` must give (the rest have defaults)."""
    return tuple(
        f.name
        for f in fields(_RECORDS[section])
        if f.name not in ("key", "name") and f.default is MISSING and f.default_factory is MISSING
    )


def build_record(section: str, key: str, data: dict[str, Any]) -> Any:
    """One record from its catalog dict; CatalogError names the bad field, or every
    missing one at once."""
    cls = _RECORDS[section]
    known = {f.name: f for f in fields(cls)}
    missing = tuple(f for f in required_fields(section) if data.get(f) is None)
    if missing:
        raise CatalogError(
            f"{section}.{key}",
            f"missing {', '.join(missing)} (required: {', '.join(required_fields(section))})",
            missing,
        )
    kwargs: dict[str, Any] = {"key": key}
    for name, value in data.items():
        if name not in known or name == "key":
            raise CatalogError(f"{section}.{key}.{name}", "unknown field")
        if isinstance(value, str) and (
            "float" in str(known[name].type) or "int" in str(known[name].type)
        ):
            value = _number(value, f"{section}.{key}.{name}")
        if name == "aliases":
            value = tuple(value or ())
        elif name == "sources":
            value = dict(value or {})
        kwargs[name] = value
    kwargs.setdefault("name", key)
    try:
        record = cls(**kwargs)
    except TypeError as exc:
        raise CatalogError(f"{section}.{key}", str(exc)) from None
    _check_positive(section, record)
    return record


def _number(text: str, where: str) -> float:
    """YAML 1.1 reads `8.03e9` as text; accept it as the number it means."""
    try:
        return float(text)
    except ValueError:
        raise CatalogError(where, f"expected a number, got {text!r}") from None


def _check_positive(section: str, record: Any) -> None:
    for f in fields(record):
        value = getattr(record, f.name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if value < 0 or math.isnan(value):
            raise CatalogError(f"{section}.{record.key}.{f.name}", "must not be negative")


@dataclass(frozen=True)
class Catalog:
    """Raw catalog entries by section and key (plain data, as read from YAML)."""

    entries: dict[str, dict[str, dict[str, Any]]]

    def names(self, section: str) -> list[str]:
        return sorted(self.entries.get(section, {}))

    def has(self, section: str, key: str) -> bool:
        return key in self.entries.get(section, {})

    def get(self, section: str, key: str) -> Any:
        if not self.has(section, key):
            known = ", ".join(self.names(section)) or "none"
            raise CatalogError(f"{section}.{key}", f"not in the catalog; known: {known}")
        return build_record(section, key, self.entries[section][key])

    def with_overrides(self, overrides: dict[str, dict[str, dict[str, Any]]]) -> Catalog:
        """A new catalog where each override entry is merged field by field."""
        merged = {s: {k: dict(v) for k, v in e.items()} for s, e in self.entries.items()}
        for section, items in overrides.items():
            for key, data in items.items():
                base = merged.setdefault(section, {}).setdefault(key, {})
                base.update({k: v for k, v in data.items() if v is not None})
                if data:
                    src = dict(base.get("sources") or {})
                    src.setdefault("override", "given in the plan spec")
                    base["sources"] = src
        return Catalog(merged)

    def gpu_for_model_name(self, model: str) -> Gpu | None:
        """The catalog GPU whose key, name or alias best matches an inventory model string."""
        wanted = _norm(model)
        if not wanted:
            return None
        best: tuple[int, str] | None = None
        for key, data in self.entries.get("gpus", {}).items():
            for cand in (key, data.get("name", ""), *(data.get("aliases") or ())):
                c = _norm(cand)
                if c and (c == wanted or c in wanted):
                    score = len(c) + (1000 if c == wanted else 0)
                    if best is None or score > best[0]:
                        best = (score, key)
        return self.get("gpus", best[1]) if best else None


def _norm(text: str) -> str:
    text = str(text).lower().replace("nvidia", "").replace("geforce", "")
    return "".join(ch for ch in text if ch.isalnum())
