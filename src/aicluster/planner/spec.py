"""`kind: plan` — the questions a team asks before it builds a cluster.

Vocabulary: `serve` lists models to serve (request rate or concurrent users, prompt and
output lengths, latency targets); `train` lists training or fine-tuning runs (tokens,
sequence length, method, target duration); `hardware` picks catalog entries (node shape,
network, shared storage) and may override or add any catalog entry; `constraints` holds
the budget and every planning assumption (see `aicluster.planner.assumptions`).

Counts such as `tokens` accept plain numbers or a suffix: `2T`, `300B`, `50M`, `1.5e12`.
A model is either a catalog name (`model: llama-3-8b`) or an explicit `architecture`.
A node is either a catalog name (`node: dgx-h100`) or an inline node
(`node: {gpu: a100-80gb-pcie, gpus: 4, power_w: 3000}`); a node's `gpu` is likewise a catalog
name or an inline GPU. Checks that need the catalog (a model's `max_context`, head counts
against `tensor_parallel`, defaults named in messages) are in `aicluster.planner.checks`.

Loading: `load_plan_spec(path)` / `load_plan_spec_text(text)` read a plan with the
`spec` layer's `SpecLoader` (same strictness, same field-and-line errors). Plans are not
platform specs: `aicluster.specs.load_spec` (what `submit`/`deploy` and the API use) knows
only jobs and services, so `spec` never imports the planner.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Discriminator,
    Field,
    PlainValidator,
    Tag,
    WithJsonSchema,
    model_validator,
)

from aicluster.planner.optimizers import OPTIMIZERS
from aicluster.specs.job import Strict
from aicluster.specs.loader import SpecLoader
from aicluster.specs.names import NAME_HELP, NAME_PATTERN, check_name

_SUFFIX = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_count(value: object) -> float:
    """A positive count from a number or text like `15.6T`, `300B`, `2e12`."""
    if isinstance(value, bool):
        raise ValueError("expected a number such as 2e12 or 300B")
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]?)\s*", value)
        if not m or m.group(2).lower() not in _SUFFIX:
            raise ValueError(f"invalid count {value!r}: use a number or a size like 300B, 2T")
        number = float(m.group(1)) * _SUFFIX[m.group(2).lower()]
    else:
        raise ValueError("expected a number such as 2e12 or 300B")
    if not number > 0 or number == float("inf"):
        raise ValueError("must be a positive, finite number")
    return number


def _name(value: str) -> str:
    return check_name(value, "name")


# The pattern stays in the JSON Schema; a bad name is explained in words, not as a regex.
Name = Annotated[
    str,
    AfterValidator(_name),
    Field(description=NAME_HELP, json_schema_extra={"pattern": NAME_PATTERN, "maxLength": 63}),
]
Count = Annotated[float, BeforeValidator(parse_count)]
Precision = Literal["fp32", "bf16", "fp16", "fp8", "int8", "int4"]
KvPrecision = Literal["fp32", "bf16", "fp16", "fp8"]
KvCacheDtype = Literal["fp16", "bf16", "fp8", "int8"]
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_SETS = ("all", "attention", "qv")


def _lora_targets(value: object) -> str | list[str]:
    """`all`, `attention`, `qv` or a non-empty list of module names (one message for all)."""
    words = f"use {', '.join(LORA_SETS)} or a list of module names from {', '.join(LORA_MODULES)}"
    if isinstance(value, str):
        if value in LORA_SETS:
            return value
        raise ValueError(f"unknown LoRA target {value!r}; {words}")
    if isinstance(value, (list, tuple)) and value:
        bad = [v for v in value if v not in LORA_MODULES]
        if bad:
            raise ValueError(f"unknown module {', '.join(map(repr, bad))}; {words}")
        return list(value)
    raise ValueError(words)


LoraTargets = Annotated[
    str | list[str],
    PlainValidator(_lora_targets),
    WithJsonSchema(
        {
            "anyOf": [
                {"enum": list(LORA_SETS)},
                {"type": "array", "items": {"enum": list(LORA_MODULES)}, "minItems": 1},
            ]
        }
    ),
]
PosInt = Annotated[int, Field(ge=1, strict=True)]
PosFloat = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]


class Architecture(Strict):
    """A decoder-only transformer, named as in a Hugging Face config.json."""

    layers: PosInt
    hidden_size: PosInt
    attention_heads: PosInt
    vocab_size: PosInt
    kv_heads: PosInt | None = None
    head_dim: PosInt | None = None
    intermediate_size: PosInt | None = None
    gated_mlp: bool = True
    experts: PosInt = Field(default=1, description="routed experts per MoE layer")
    active_experts: PosInt = Field(default=1, description="routed experts each token uses")
    shared_experts: Annotated[int, Field(ge=0, strict=True)] = Field(
        default=0, description="experts every token uses (DeepSeek: n_shared_experts)"
    )
    moe_intermediate_size: PosInt | None = Field(
        default=None, description="one expert's intermediate size; default intermediate_size"
    )
    dense_layers: Annotated[int, Field(ge=0, strict=True)] = Field(
        default=0,
        description="leading layers with a dense MLP of intermediate_size "
        "(DeepSeek: first_k_dense_replace)",
    )
    tied_embeddings: bool = False
    max_context: PosInt | None = None
    sliding_window: PosInt | None = Field(
        default=None, description="attention window (tokens); bounds the KV cache per sequence"
    )
    sliding_window_pattern: PosInt | None = Field(
        default=None,
        description="every N-th layer attends globally, the others use sliding_window "
        "(Gemma 2: 2, Gemma 3: 6); default: every layer uses the window",
    )
    kv_lora_rank: PosInt | None = Field(
        default=None, description="multi-head latent attention: the cached KV latent (DeepSeek)"
    )
    q_lora_rank: PosInt | None = None
    qk_rope_head_dim: PosInt | None = None
    qk_nope_head_dim: PosInt | None = None
    v_head_dim: PosInt | None = None
    params: Count | None = Field(default=None, description="total; computed when omitted")

    @model_validator(mode="after")
    def _consistent(self) -> Architecture:
        if self.active_experts > self.experts:
            raise ValueError("active_experts must not exceed experts")
        if self.dense_layers >= self.layers:
            raise ValueError(
                f"dense_layers {self.dense_layers} must be fewer than layers {self.layers}"
            )
        if self.sliding_window_pattern is not None and self.sliding_window is None:
            raise ValueError("sliding_window_pattern needs sliding_window (the local window)")
        if self.kv_heads and self.attention_heads % self.kv_heads:
            raise ValueError("attention_heads must be a multiple of kv_heads")
        if self.head_dim is None and self.hidden_size % self.attention_heads:
            raise ValueError("hidden_size must be a multiple of attention_heads (or set head_dim)")
        return self


class ModelOverride(Strict):
    """Change fields of a catalog model, or add a model (then the shape fields are required)."""

    name: str | None = None
    layers: PosInt | None = None
    hidden_size: PosInt | None = None
    attention_heads: PosInt | None = None
    vocab_size: PosInt | None = None
    kv_heads: PosInt | None = None
    head_dim: PosInt | None = None
    intermediate_size: PosInt | None = None
    gated_mlp: bool | None = None
    experts: PosInt | None = None
    active_experts: PosInt | None = None
    shared_experts: Annotated[int, Field(ge=0, strict=True)] | None = None
    moe_intermediate_size: PosInt | None = None
    dense_layers: Annotated[int, Field(ge=0, strict=True)] | None = None
    tied_embeddings: bool | None = None
    max_context: PosInt | None = None
    sliding_window: PosInt | None = None
    sliding_window_pattern: PosInt | None = None
    kv_lora_rank: PosInt | None = None
    q_lora_rank: PosInt | None = None
    qk_rope_head_dim: PosInt | None = None
    qk_nope_head_dim: PosInt | None = None
    v_head_dim: PosInt | None = None
    params: Count | None = None
    sources: dict[str, str] | None = None


class GpuOverride(Strict):
    """Change figures of a catalog GPU, or add one (then memory_gib, memory_bandwidth_gb_s,
    bf16_tflops and tdp_w are required)."""

    name: str | None = None
    aliases: list[str] | None = None
    memory_gib: PosFloat | None = None
    memory_bandwidth_gb_s: PosFloat | None = None
    bf16_tflops: PosFloat | None = None
    fp8_tflops: PosFloat | None = None
    int8_tops: PosFloat | None = None
    fp32_tflops: PosFloat | None = None
    tdp_w: PosFloat | None = None
    nvlink_gb_s: PosFloat | None = None
    pcie_gb_s: PosFloat | None = None
    price_usd: Annotated[float, Field(ge=0)] | None = None
    sources: dict[str, str] | None = None


def _ref_kind(value: object) -> str | None:
    """A catalog name (text) or an inline entry (a mapping); None: neither (one clear error).

    The tags look like pydantic's own union tags so the spec loader leaves them out of
    error locations (`hardware.node.gpus`, not `hardware.node.<tag>.gpus`)."""
    if isinstance(value, str):
        return "str"
    if isinstance(value, (dict, Strict)):
        return "dict[str,any]"
    return None


GpuRef = Annotated[
    Annotated[str, Tag("str")] | Annotated[GpuOverride, Tag("dict[str,any]")],
    Discriminator(
        _ref_kind,
        custom_error_type="gpu_ref",
        custom_error_message="expected a catalog GPU name or an inline GPU "
        "{memory_gib, memory_bandwidth_gb_s, bf16_tflops, tdp_w}",
    ),
]


class NodeOverride(Strict):
    """Change figures of a catalog node shape, or add one (then gpu, gpus and power_w are
    required). `gpu` is a catalog GPU name or an inline GPU."""

    name: str | None = None
    gpu: GpuRef | None = None
    gpus: PosInt | None = None
    cpus: PosInt | None = None
    memory_gib: PosFloat | None = None
    power_w: PosFloat | None = None
    nics: PosInt | None = None
    nvme_tb: Annotated[float, Field(ge=0)] | None = None
    nvme_read_gb_s: PosFloat | None = None
    price_usd: Annotated[float, Field(ge=0)] | None = None
    base_price_usd: Annotated[float, Field(ge=0)] | None = None
    rack_units: PosInt | None = None
    sources: dict[str, str] | None = None


NodeRef = Annotated[
    Annotated[str, Tag("str")] | Annotated[NodeOverride, Tag("dict[str,any]")],
    Discriminator(
        _ref_kind,
        custom_error_type="node_ref",
        custom_error_message="expected a catalog node name or an inline node {gpu, gpus, power_w}",
    ),
]


class _Workload(Strict):
    name: Name
    model: str | None = Field(default=None, description="catalog model name, e.g. llama-3-8b")
    architecture: Architecture | None = None
    node: NodeRef | None = Field(
        default=None, description="node shape (a name or an inline node); default hardware.node"
    )

    @model_validator(mode="after")
    def _one_model(self):
        if (self.model is None) == (self.architecture is None):
            raise ValueError("give exactly one of model (a catalog name) or architecture")
        return self


class ServeWorkload(_Workload):
    precision: Precision = "bf16"
    kv_cache_dtype: KvCacheDtype | None = Field(
        default=None, description="KV cache element type; default bf16 (fp8 with fp8 weights)"
    )
    kv_precision: KvPrecision | None = Field(
        default=None, description="older name of kv_cache_dtype (also takes fp32)"
    )
    context_length: PosInt | None = Field(
        default=None, description="longest sequence served; default prompt+output"
    )
    prompt_tokens: PosInt = 1000
    output_tokens: PosInt = 250
    requests_per_second: PosFloat | None = None
    concurrent_users: PosInt | None = None
    ttft_ms: PosFloat | None = Field(default=None, description="time to first token target")
    tpot_ms: PosFloat | None = Field(default=None, description="time per output token target")
    tensor_parallel: PosInt | None = None
    pipeline_parallel: PosInt | None = None
    expert_parallel: PosInt | None = Field(
        default=None,
        description="split a mixture-of-experts model's routed experts whole over this many "
        "GPUs of a replica (vLLM's --enable-expert-parallel): the tensor-parallel ranks, so "
        "it sets tensor_parallel; default: experts sliced by tensor parallelism",
    )
    min_replicas: PosInt = 1

    @model_validator(mode="after")
    def _demand(self) -> ServeWorkload:
        if self.requests_per_second is not None and self.concurrent_users is not None:
            raise ValueError("give requests_per_second or concurrent_users, not both")
        if self.kv_cache_dtype is not None and self.kv_precision is not None:
            raise ValueError("give kv_cache_dtype or kv_precision (its older name), not both")
        return self

    @property
    def kv_dtype(self) -> str:
        """The KV cache element type used: given, else bf16 (fp8 with fp8 weights)."""
        return (
            self.kv_cache_dtype
            or self.kv_precision
            or ("fp8" if self.precision == "fp8" else "bf16")
        )


class TrainWorkload(_Workload):
    method: Literal["full", "lora", "qlora"] = "full"
    tokens: Count = Field(description="training tokens per epoch, e.g. 2T or 5e8")
    epochs: PosFloat = 1.0
    sequence_length: PosInt = 4096
    global_batch_tokens: Count | None = Field(
        default=None, description="default 4M (full), 256K (LoRA)"
    )
    micro_batch: PosInt = 1
    lora_rank: PosInt = 16
    lora_targets: LoraTargets = Field(
        default="all",
        description="all linear layers, attention (q,k,v,o), qv (LoRA's q and v), "
        "or a list of module names such as [q_proj, v_proj]",
    )
    optimizer: Literal[OPTIMIZERS] = Field(
        default="adamw",
        description="adamw: fp32 states + fp32 master weights (16 bytes/param with weights "
        "and grads); adamw_bf16: bf16 states, no master (8); adamw_8bit / paged_adamw_8bit: "
        "bitsandbytes 8-bit states; paged_adamw: paged 32-bit states; sgd, sgd_momentum; adafactor: factored second moment",
    )
    master_weights: bool | None = Field(
        default=None,
        description="keep an fp32 copy of the weights; default yes (no for adamw_bf16)",
    )
    offload_optimizer: bool = Field(
        default=False,
        description="ZeRO-Offload: master weights, optimizer states and gradients in CPU memory",
    )
    strategy: Literal["auto", "ddp", "zero1", "zero2", "zero3", "fsdp"] = "auto"
    tensor_parallel: PosInt | None = None
    pipeline_parallel: PosInt | None = None
    context_parallel: PosInt | None = Field(
        default=None,
        description="ranks each sequence is split over (ring attention); default: searched",
    )
    expert_parallel: PosInt | None = Field(
        default=None,
        description="ranks a mixture-of-experts model's experts are split over; default: searched",
    )
    activation_checkpointing: Literal["none", "selective", "full"] = "selective"
    precision: Literal["bf16", "fp8"] = "bf16"
    gpus: PosInt | None = Field(default=None, description="fixed GPU count; default: derived")
    target_hours: PosFloat | None = None
    target_days: PosFloat | None = None

    @model_validator(mode="after")
    def _target(self) -> TrainWorkload:
        if self.target_hours is not None and self.target_days is not None:
            raise ValueError("give target_hours or target_days, not both")
        return self


class InterconnectOverride(Strict):
    name: str | None = None
    kind: Literal["ethernet", "infiniband", "pcie", "nvlink"] | None = None
    gbit_s: PosFloat | None = None
    switch_ports: PosInt | None = None
    switch_power_w: Annotated[float, Field(ge=0)] | None = None
    switch_price_usd: Annotated[float, Field(ge=0)] | None = None
    sources: dict[str, str] | None = None


class StorageOverride(Strict):
    name: str | None = None
    read_gb_s: PosFloat | None = None
    write_gb_s: PosFloat | None = None
    sources: dict[str, str] | None = None


class Hardware(Strict):
    node: NodeRef = Field(
        default="dgx-h100", description="default node shape: a catalog name or an inline node"
    )
    network: str = Field(default="infiniband-ndr", description="node-to-node network")
    shared_storage: str = Field(default="nfs-25gbe", description="catalog storage entry")
    nics_per_node: PosInt | None = Field(default=None, description="default: the node shape's")
    gpus: dict[str, GpuOverride] = Field(default_factory=dict)
    nodes: dict[str, NodeOverride] = Field(default_factory=dict)
    interconnects: dict[str, InterconnectOverride] = Field(default_factory=dict)
    storage: dict[str, StorageOverride] = Field(default_factory=dict)


class Constraints(Strict):
    budget_usd: Annotated[float, Field(gt=0)] | None = None
    mfu: Fraction | None = Field(
        default=None, description="training MFU; default by model size and GPU class"
    )
    mfu_scale: Fraction | None = None
    goodput: Fraction | None = Field(
        default=None, description="share of wall time a run makes progress; default 0.9"
    )
    prefill_efficiency: Fraction | None = None
    bandwidth_efficiency: Fraction | None = None
    network_efficiency: Fraction | None = None
    nvlink_efficiency: Fraction | None = None
    allreduce_latency_us: Annotated[float, Field(ge=0)] | None = None
    allreduce_latency_per_doubling_us: Annotated[float, Field(ge=0)] | None = None
    step_overhead_per_layer_us: Annotated[float, Field(ge=0)] | None = None
    step_overhead_us: Annotated[float, Field(ge=0)] | None = None
    gpu_memory_utilization: Fraction | None = None
    runtime_overhead_gib: Annotated[float, Field(ge=0)] | None = None
    engine_non_torch_gib: Annotated[float, Field(ge=0)] | None = None
    engine_tp_buffers_gib: Annotated[float, Field(ge=0)] | None = None
    max_num_batched_tokens: PosInt | None = None
    max_num_seqs: PosInt | None = None
    utilization: Fraction | None = None
    pue: Annotated[float, Field(ge=1, le=3)] | None = None
    electricity_usd_per_kwh: Annotated[float, Field(ge=0)] | None = None
    rack_power_kw: PosFloat | None = None
    amortization_months: PosInt | None = None
    checkpoint_interval_minutes: PosFloat | None = None


class PlanSpec(Strict):
    kind: Literal["plan"] = "plan"
    name: Name
    description: str | None = None
    hardware: Hardware = Field(default_factory=Hardware)
    models: dict[str, ModelOverride] = Field(default_factory=dict)
    serve: list[ServeWorkload] = Field(default_factory=list)
    train: list[TrainWorkload] = Field(default_factory=list)
    constraints: Constraints = Field(default_factory=Constraints)

    @model_validator(mode="after")
    def _workloads(self) -> PlanSpec:
        if not self.serve and not self.train:
            raise ValueError("a plan needs at least one workload under serve or train")
        names = [w.name for w in (*self.serve, *self.train)]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"workload names must be unique; repeated: {', '.join(dupes)}")
        return self


_LOADER = SpecLoader(PlanSpec)


def load_plan_spec_text(text: str, source: str = "<spec>") -> PlanSpec:
    """A plan from YAML text, or SpecError naming each bad field and its line."""
    return _LOADER.load_text(text, source)


def load_plan_spec(path: str | Path) -> PlanSpec:
    """A plan from a YAML file, or SpecError (unreadable file, bad YAML, bad fields)."""
    return _LOADER.load(path)
