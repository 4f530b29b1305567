"""Training arithmetic: compute, time, memory per GPU, parallel layout, gradient traffic.

Vocabulary: N parameters, D training tokens, n GPUs = dp x tp x pp; a step processes
`global_batch_tokens`; MFU is model FLOPs utilisation (model FLOPs / (time · peak)).
Units: FLOPs, seconds, bytes. Invariants: model FLOPs per token = 6·N_non-embedding (full)
or 4·N + 6·N_lora (LoRA) plus the causal attention term; run time = steps x max(compute,
gradient sync) / goodput; MFU is `constraints.mfu` or the size/GPU table in `mfu`.

Sources:
- Kaplan et al. 2020 (arXiv:2001.08361) Sec. 2.1 and Hoffmann et al. 2022 (Chinchilla,
  arXiv:2203.15556): training compute C ≈ 6·N·D (2N forward + 4N backward per token).
  Checks (`six_nd_flops`): Llama 3 405B on 15.6T tokens = 3.8e25 FLOPs (Dubey et al. 2024,
  Sec. 3.2.1); GPT-3 175B on 300B tokens = 3.14e23 (Brown et al. 2020, Table D.1).
- Attention: PaLM App. B's 12·L·H·Q·T, halved for the causal mask.
- LoRA freezes the base: backward still propagates activation gradients (2N) but skips
  weight gradients (2N), so ≈ 4·N·D + 6·N_lora·D (derived from the 6ND split above).
- Chowdhery et al. 2022 (PaLM, arXiv:2204.02311) App. B: MFU definition.
- Memory: see `memory` ([ZeRO], [SP]). Communication: see `network`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from aicluster.planner.assumptions import Assumptions
from aicluster.planner.hardware import GIB, Gpu, ModelShape
from aicluster.planner.memory import (
    STRATEGIES,
    WEIGHT_BITS,
    TrainingMemory,
    activation_bytes,
    adafactor_state_values,
    lora_params,
    model_state,
    param_counts,
)
from aicluster.planner.mfu import table_mfu
from aicluster.planner.network import gradient_sync

METHODS = ("full", "lora", "qlora")


@dataclass(frozen=True)
class TrainRequest:
    name: str
    model: ModelShape
    gpu: Gpu
    gpus_per_node: int
    node_network_gb_s: float  # per node, per direction, all compute NICs together
    tokens: float
    method: str = "full"
    sequence_length: int = 4096
    global_batch_tokens: int = 4 * 2**20
    micro_batch: int = 1
    lora_rank: int = 16
    lora_targets: str | tuple[str, ...] = "all"
    optimizer: str = "adamw"
    master_weights: bool | None = None  # None: the optimizer's default (optimizers module)
    offload_optimizer: bool = False
    strategy: str = "auto"
    tensor_parallel: int | None = None
    pipeline_parallel: int | None = None
    checkpointing: str = "selective"
    gpus: int | None = None
    target_seconds: float | None = None
    precision: str = "bf16"


@dataclass(frozen=True)
class Layout:
    strategy: str
    dp: int
    tp: int
    pp: int
    memory: TrainingMemory
    fits: bool

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp


@dataclass(frozen=True)
class TrainPlan:
    request: TrainRequest
    params: float
    trainable_params: float
    flops_per_token: float
    total_flops: float
    gpus: int
    nodes: int
    layout: Layout | None
    step_compute_s: float
    step_comm_s: float
    comm_bytes_per_node: float
    steps: int
    seconds: float
    compute_bound_seconds: float
    break_even_gbit_s: float
    checkpoint_bytes: float
    gpus_for_target: int | None
    mfu: float = 0.0
    notes: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        return self.layout is not None and self.layout.fits

    @property
    def network_bound(self) -> bool:
        return self.step_comm_s > self.step_compute_s


def trainable_and_frozen(r: TrainRequest) -> tuple[float, float]:
    total = param_counts(r.model).total
    if r.method == "full":
        return total, 0.0
    return lora_params(r.model, r.lora_rank, r.lora_targets), total


def attended_tokens(m: ModelShape, seq: int) -> float:
    """Keys a query attends to on average in a causal sequence of `seq` tokens: seq/2, or
    with a sliding window W < seq, W·(1 - W/(2·seq)) (the first W queries see i, the rest W)."""
    w = m.sliding_window
    if not w or w >= seq:
        return seq / 2
    return w * (1 - w / (2 * seq))


def attention_flops_per_token(m: ModelShape, seq: int) -> float:
    """Forward + backward FLOPs of the attention scores and values per token: 12·L·H·Q·T
    (Chowdhery et al. 2022, PaLM, arXiv:2204.02311, App. B: "6N + 12LHQT") with T the keys
    a query sees; causal masking halves T (the masked half is skipped by FlashAttention-2,
    Dao 2023, arXiv:2307.08691, Sec. 3.1.1). Llama 3 8B at 8k: 6.4e9, +13% on 6·N."""
    return 12 * m.layers * m.attention_heads * m.d_head * attended_tokens(m, seq)


def six_nd_flops(r: TrainRequest) -> float:
    """6·N·D with N every parameter (the textbook count that published totals use)."""
    return 6 * param_counts(r.model).active * r.tokens


def flops_per_token(r: TrainRequest) -> float:
    """Model FLOPs per training token: 6·N for full training, 4·N + 6·N_lora for LoRA and
    QLoRA (frozen weights need no weight gradients), N the active parameters without the
    input embedding (a lookup, no matmul; Kaplan et al. 2020, arXiv:2001.08361, Sec. 2.1
    counts non-embedding parameters), plus the causal attention term (no weights, so LoRA
    pays all of it)."""
    c = param_counts(r.model)
    n = c.active - c.embedding
    attention = attention_flops_per_token(r.model, r.sequence_length)
    if r.method == "full":
        return 6 * n + attention
    return 4 * n + 6 * lora_params(r.model, r.lora_rank, r.lora_targets) + attention


def run_mfu(r: TrainRequest, a: Assumptions) -> float:
    """The MFU planned: `constraints.mfu`, else by model size and GPU class (`mfu`)."""
    return a.mfu or table_mfu(param_counts(r.model).total, r.gpu.bf16_tflops)


def training_flops(r: TrainRequest) -> float:
    """Model FLOPs of the whole run: flops_per_token x tokens (C = 6ND for full training)."""
    return flops_per_token(r) * r.tokens


def _factored(r: TrainRequest) -> float | None:
    """Adafactor's factored state size (fp32 values), else None."""
    if r.optimizer != "adafactor":
        return None
    lora = r.method != "full"
    return adafactor_state_values(r.model, lora, r.lora_rank, r.lora_targets)


def _frozen_split(r: TrainRequest) -> tuple[float, float, float]:
    """(frozen quantizable, frozen kept 16-bit, bits of the quantizable part). QLoRA stores
    the block matmuls in NF4 and embeddings, LM head and norms in 16 bits (bitsandbytes
    replaces nn.Linear layers only and skips the output head); LoRA keeps all in 16 bits."""
    if r.method == "full":
        return 0.0, 0.0, 16.0
    c = param_counts(r.model)
    if r.method == "qlora":
        return c.linear, c.total - c.linear, WEIGHT_BITS["nf4"]
    return c.total, 0.0, 16.0


def memory_per_gpu(r: TrainRequest, a: Assumptions, strategy: str, dp: int, tp: int, pp: int):
    trainable, _ = trainable_and_frozen(r)
    frozen, frozen_16, bits = _frozen_split(r)
    st = model_state(
        trainable,
        frozen,
        strategy,
        dp,
        tp * pp,
        bits,
        frozen_16bit=frozen_16,
        optimizer=r.optimizer,
        master_weights=r.master_weights,
        offload=r.offload_optimizer,
        factored=_factored(r),
    )
    act = activation_bytes(r.model, r.sequence_length, r.micro_batch, tp, r.checkpointing)
    return TrainingMemory(
        st.weights, st.gradients, st.optimizer, act, a.runtime_overhead_gib * GIB, st.host
    )


def checkpoint_bytes(r: TrainRequest) -> float:
    """A full training checkpoint: 16-bit trainable weights + master weights + optimizer
    states (what a resume needs), whole model (one DP replica)."""
    trainable, _ = trainable_and_frozen(r)
    st = model_state(
        trainable,
        0.0,
        "ddp",
        1,
        optimizer=r.optimizer,
        master_weights=r.master_weights,
        factored=_factored(r),
    )
    return st.weights + st.optimizer + st.host


def _layouts(r: TrainRequest, n: int) -> list[tuple[str, int, int]]:
    """(strategy, tp, pp) candidates for n GPUs, least model parallelism first, then the
    lowest ZeRO stage (less communication)."""
    strategies = STRATEGIES if r.strategy == "auto" else (r.strategy,)
    tps = (
        [r.tensor_parallel]
        if r.tensor_parallel
        else [t for t in (1, 2, 4, 8) if t <= r.gpus_per_node and r.model.splits_heads(t)]
    )
    pps = [r.pipeline_parallel] if r.pipeline_parallel else [1, 2, 4, 8, 16]
    out = []
    for tp in tps:
        for pp in pps:
            if n % (tp * pp) == 0 and pp <= r.model.layers:
                out.extend((s, tp, pp) for s in strategies)
    out.sort(key=lambda c: (c[1] * c[2], c[2], STRATEGIES.index(c[0])))
    return out


def choose_layout(r: TrainRequest, a: Assumptions, n: int) -> Layout | None:
    """The first candidate layout whose memory fits one GPU, or the best non-fitting one."""
    usable = r.gpu.memory_bytes
    best: Layout | None = None
    for strategy, tp, pp in _layouts(r, n):
        dp = n // (tp * pp)
        mem = memory_per_gpu(r, a, strategy, dp, tp, pp)
        layout = Layout(strategy, dp, tp, pp, mem, mem.total <= usable)
        if layout.fits:
            return layout
        if best is None or mem.total < best.memory.total:
            best = layout
    return best


def round_gpus(n: int, per_node: int) -> int:
    """Within a node: the next power of two; beyond: whole nodes."""
    if n <= per_node:
        p = 1
        while p < n:
            p *= 2
        return min(p, per_node)
    return math.ceil(n / per_node) * per_node


def _min_fitting_gpus(r: TrainRequest, a: Assumptions, limit: int = 4096) -> int:
    n = 1
    while n <= limit:
        layout = choose_layout(r, a, n)
        if layout and layout.fits:
            return n
        n = round_gpus(n + 1, r.gpus_per_node)
    return limit


def plan_training(r: TrainRequest, a: Assumptions) -> TrainPlan:
    """GPUs (given, or enough for the target duration, or the fewest that fit), layout, time."""
    flops = training_flops(r)
    peak = r.gpu.peak_flops(r.precision)
    mfu = run_mfu(r, a)
    gpus_for_target = None
    if r.target_seconds:
        gpus_for_target = math.ceil(flops / (r.target_seconds * a.goodput * peak * mfu))
    if r.gpus:
        n = r.gpus
    else:
        n = max(_min_fitting_gpus(r, a), round_gpus(gpus_for_target or 1, r.gpus_per_node))
    layout = choose_layout(r, a, n)
    nodes = math.ceil(n / r.gpus_per_node)
    trainable, _ = trainable_and_frozen(r)
    steps = max(1, math.ceil(r.tokens / r.global_batch_tokens))
    step_compute = flops_per_token(r) * r.global_batch_tokens / (n * peak * mfu)
    mp = layout.tp * layout.pp if layout else 1
    strategy = layout.strategy if layout else "ddp"
    sync = gradient_sync(trainable, nodes, r.gpus_per_node, mp, strategy)
    comm_s = sync / (r.node_network_gb_s * 1e9 * a.network_efficiency) if sync else 0.0
    seconds = steps * max(step_compute, comm_s) / a.goodput
    notes = []
    if layout and not layout.fits:
        notes.append("does not fit in GPU memory with any layout of these GPUs")
    if r.gpus and gpus_for_target and r.gpus < gpus_for_target:
        notes.append(f"the target duration needs about {gpus_for_target} GPUs")
    full_ckpt = checkpoint_bytes(r)
    return TrainPlan(
        request=r,
        params=param_counts(r.model).total,
        trainable_params=trainable,
        flops_per_token=flops_per_token(r),
        total_flops=flops,
        gpus=n,
        nodes=nodes,
        layout=layout,
        step_compute_s=step_compute,
        step_comm_s=comm_s,
        comm_bytes_per_node=sync,
        steps=steps,
        seconds=seconds,
        compute_bound_seconds=flops / (n * peak * mfu) / a.goodput,
        mfu=mfu,
        break_even_gbit_s=(sync * 8 / 1e9 / a.network_efficiency / step_compute) if sync else 0.0,
        checkpoint_bytes=full_ckpt,
        gpus_for_target=gpus_for_target,
        notes=tuple(notes),
    )


def time_vs_nodes(
    r: TrainRequest, a: Assumptions, max_nodes: int
) -> list[tuple[int, float | None]]:
    """(nodes, days) for 1..max_nodes nodes, with the network bound included (for charts);
    days is None where no layout of that many GPUs fits in memory."""
    out: list[tuple[int, float | None]] = []
    for nodes in range(1, max(1, max_nodes) + 1):
        n = nodes * r.gpus_per_node
        plan = plan_training(_with_gpus(r, n), a)
        out.append((nodes, plan.seconds / 86400 if plan.fits else None))
    return out


def _with_gpus(r: TrainRequest, n: int) -> TrainRequest:
    from dataclasses import replace

    return replace(r, gpus=n, target_seconds=None)
