"""Training arithmetic: compute, time, memory per GPU, parallel layout, gradient traffic.

Vocabulary: N parameters, D training tokens, n GPUs = dp x tp x pp x cp x ep (`Layout`:
tensor, pipeline, context and expert parallelism); a step processes
`global_batch_tokens`; MFU is model FLOPs utilisation (model FLOPs / (time · peak)).
Units: FLOPs, seconds, bytes. Invariants: model FLOPs per token = 6·N_non-embedding (full)
or 4·N + 6·N_lora (LoRA) plus the causal attention term; run time = steps x max(compute,
gradient sync) / goodput, where the step adds the context-parallel ring's exposed time and
the expert-parallel all-to-alls (`parallel_comm_per_step`); MFU is `constraints.mfu` or the
size/GPU table in `mfu`.

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
from aicluster.planner.network import (
    all_to_all_s,
    gpu_links,
    gradient_sync,
    ring_attention_exposed_s,
)

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
    context_parallel: int | None = None
    expert_parallel: int | None = None
    checkpointing: str = "selective"
    gpus: int | None = None
    target_seconds: float | None = None
    precision: str = "bf16"


@dataclass(frozen=True)
class Layout:
    """GPUs = tp x pp x cp x ep x dp (Megatron-LM's order: tensor innermost, then context,
    expert, data, pipeline). `dp` replicates everything; the layers other than the routed
    experts are also replicated over the ep ranks (expert parallelism is carved out of data
    parallelism: Megatron-Core MoE, DeepSpeed-MoE), so they see ep x dp data-parallel ranks,
    and a sequence is split over cp ranks that hold the same weights."""

    strategy: str
    dp: int
    tp: int
    pp: int
    memory: TrainingMemory
    fits: bool
    cp: int = 1
    ep: int = 1

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp * self.ep

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp * self.ep


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
    step_cp_s: float = 0.0  # context-parallel ring time not hidden by attention, per step
    step_ep_s: float = 0.0  # expert-parallel all-to-all time per step (not overlapped)

    @property
    def fits(self) -> bool:
        return self.layout is not None and self.layout.fits

    @property
    def network_bound(self) -> bool:
        return self.step_comm_s > self.step_compute_s + self.step_cp_s + self.step_ep_s


def trainable_and_frozen(r: TrainRequest) -> tuple[float, float]:
    total = param_counts(r.model).total
    if r.method == "full":
        return total, 0.0
    return lora_params(r.model, r.lora_rank, r.lora_targets), total


def attended_tokens(m: ModelShape, seq: int) -> float:
    """Keys a query attends to on average in a causal sequence of `seq` tokens, averaged over
    the layers: seq/2 in a global layer; with a sliding window W < seq, W·(1 - W/(2·seq))
    (the first W queries see i, the rest W). `sliding_window_pattern` p: L//p global
    layers, the rest local (Gemma 2 and 3); without it every layer is local (Mistral)."""
    w = m.sliding_window
    full = seq / 2
    if not w or w >= seq:
        return full
    local = w * (1 - w / (2 * seq))
    g = m.global_layers
    return (g * full + (m.layers - g) * local) / m.layers


def attention_flops_per_token(m: ModelShape, seq: int) -> float:
    """Forward + backward FLOPs of the attention scores and values per token: 12·L·H·Q·T
    (Chowdhery et al. 2022, PaLM, arXiv:2204.02311, App. B: "6N + 12LHQT") with T the keys
    a query sees and H·Q the attention width (MLA: heads x (192 + 128)/2 for DeepSeek-V3's
    score and value widths); causal masking halves T (the masked half is skipped by
    FlashAttention-2, Dao 2023, arXiv:2307.08691, Sec. 3.1.1). Llama 3 8B at 8k: 6.4e9, +13%
    on 6·N."""
    return 12 * m.layers * m.attention_width() * attended_tokens(m, seq)


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
    """The MFU planned: `constraints.mfu`, else by model size and GPU class (`mfu`), times
    `mfu_scale` (1 unless calibrated)."""
    return (a.mfu or table_mfu(param_counts(r.model).total, r.gpu.bf16_tflops)) * a.mfu_scale


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


def expert_split(r: TrainRequest) -> tuple[float, float]:
    """(trainable, frozen) parameters of the routed experts: what expert parallelism shards
    (shared experts, attention and dense layers are sharded like a dense model's)."""
    if not r.model.is_moe:
        return 0.0, 0.0
    c = param_counts(r.model)
    if r.method == "full":
        return c.routed, 0.0
    return lora_params(r.model, r.lora_rank, r.lora_targets, routed_only=True), c.routed


def memory_per_gpu(
    r: TrainRequest,
    a: Assumptions,
    strategy: str,
    dp: int,
    tp: int,
    pp: int,
    cp: int = 1,
    ep: int = 1,
) -> TrainingMemory:
    """Bytes per GPU of a layout (see `Layout`): the routed experts' state split over
    tp x pp x ep and ZeRO-sharded over dp x cp ranks; everything else split over tp x pp and
    ZeRO-sharded over dp x cp x ep ranks (Megatron's distributed optimizer shards over the
    data-parallel group with its context-parallel ranks); activations over tp and cp."""
    trainable, _ = trainable_and_frozen(r)
    frozen, frozen_16, bits = _frozen_split(r)
    t_e, f_e = expert_split(r)
    factored = _factored(r)
    share = t_e / trainable if trainable else 0.0

    def state(train: float, froz: float, f16: float, shards: int, mp: int, fac: float | None):
        return model_state(
            train,
            froz,
            strategy,
            shards,
            mp,
            bits,
            frozen_16bit=f16,
            optimizer=r.optimizer,
            master_weights=r.master_weights,
            offload=r.offload_optimizer,
            factored=fac,
        )

    dense_fac = None if factored is None else factored * (1 - share)
    st = state(trainable - t_e, frozen - f_e, frozen_16, dp * cp * ep, tp * pp, dense_fac)
    weights, grads, opt, host = st.weights, st.gradients, st.optimizer, st.host
    if t_e or f_e:
        ex = state(
            t_e, f_e, 0.0, dp * cp, tp * pp * ep, None if factored is None else factored * share
        )
        weights, grads = weights + ex.weights, grads + ex.gradients
        opt, host = opt + ex.optimizer, host + ex.host
    act = activation_bytes(r.model, r.sequence_length, r.micro_batch, tp, r.checkpointing, cp)
    return TrainingMemory(weights, grads, opt, act, a.runtime_overhead_gib * GIB, host)


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


CP_CHOICES = (1, 2, 4, 8, 16, 32)
STRATEGY_RANK = {name: i for i, name in enumerate(STRATEGIES)}


def _cp_choices(r: TrainRequest) -> list[int]:
    """Context-parallel sizes: the one given, else those that split the sequence into 2·cp
    equal chunks (Megatron-LM's load-balanced causal split: rank i gets chunks i and
    2cp-1-i, get_batch_on_this_cp_rank)."""
    if r.context_parallel:
        return [r.context_parallel]
    return [c for c in CP_CHOICES if c == 1 or r.sequence_length % (2 * c) == 0]


def _ep_choices(r: TrainRequest) -> list[int]:
    """Expert-parallel sizes: the one given, else the powers of two that divide the experts
    (1 for a dense model)."""
    if r.expert_parallel:
        return [r.expert_parallel]
    e = r.model.experts if r.model.is_moe else 1
    return [x for x in (2**i for i in range(12)) if x <= e and e % x == 0]


def _layouts(r: TrainRequest, n: int) -> list[tuple[str, int, int, int, int]]:
    """(strategy, tp, pp, cp, ep) candidates for n GPUs, least model parallelism
    (tp x pp x cp x ep) first; at equal degree fewer pipeline stages, then expert over tensor
    over context parallelism (EP shards only the experts, CP only the activations), then the
    lowest ZeRO stage (less communication)."""
    strategies = STRATEGIES if r.strategy == "auto" else (r.strategy,)
    tps = (
        [r.tensor_parallel]
        if r.tensor_parallel
        else [t for t in (1, 2, 4, 8) if t <= r.gpus_per_node and r.model.splits_heads(t)]
    )
    pps = [r.pipeline_parallel] if r.pipeline_parallel else [1, 2, 4, 8, 16]
    cps, eps = _cp_choices(r), _ep_choices(r)
    out = []
    for tp in tps:
        for pp in pps:
            if pp > r.model.layers:
                continue
            for cp in cps:
                for ep in eps:
                    if n % (tp * pp * cp * ep) == 0:
                        out.extend((s, tp, pp, cp, ep) for s in strategies)
    out.sort(key=lambda c: (c[1] * c[2] * c[3] * c[4], c[2], c[3], c[1], STRATEGY_RANK[c[0]]))
    return out


def choose_layout(r: TrainRequest, a: Assumptions, n: int) -> Layout | None:
    """The first candidate layout whose memory fits one GPU, or the best non-fitting one.
    ZeRO-3 needs the least memory of the strategies, so a parallel split whose ZeRO-3 does
    not fit is skipped whole (the answer is the same, found faster)."""
    usable = r.gpu.memory_bytes
    best: Layout | None = None
    hopeless: set[tuple[int, int, int, int]] = set()
    for strategy, tp, pp, cp, ep in _layouts(r, n):
        split = (tp, pp, cp, ep)
        if split in hopeless:
            continue
        dp = n // (tp * pp * cp * ep)
        if r.strategy == "auto" and strategy != "zero3":
            low = memory_per_gpu(r, a, "zero3", dp, tp, pp, cp, ep)
            if low.total > usable:
                hopeless.add(split)
                # with one data-parallel rank every strategy needs the same memory
                name = strategy if dp == 1 else "zero3"
                layout = Layout(name, dp, tp, pp, low, False, cp, ep)
                if best is None or low.total < best.memory.total:
                    best = layout
                continue
        mem = memory_per_gpu(r, a, strategy, dp, tp, pp, cp, ep)
        layout = Layout(strategy, dp, tp, pp, mem, mem.total <= usable, cp, ep)
        if layout.fits:
            return layout
        if best is None or mem.total < best.memory.total:
            best = layout
    return best


def fixed_group(r: TrainRequest) -> int:
    """GPUs of one data-parallel replica as far as the request fixes them."""
    return (
        (r.tensor_parallel or 1)
        * (r.pipeline_parallel or 1)
        * (r.context_parallel or 1)
        * (r.expert_parallel or 1)
    )


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


def _cp_kv_bytes_per_token_layer(m: ModelShape) -> float:
    """16-bit K and V of one token in one layer as context parallelism exchanges them:
    2 x kv_heads x head_dim x 2 bytes; MLA trains with the up-projected heads (no absorption),
    heads x (score width + value width) x 2 bytes."""
    if m.mla:
        return m.attention_heads * (m.qk_dim + m.v_dim) * 2
    return 2 * m.n_kv_heads * m.d_head * 2


def parallel_comm_per_step(
    r: TrainRequest, a: Assumptions, lay: Layout, mfu: float
) -> tuple[float, float]:
    """(context-parallel exposed ring time, expert-parallel all-to-all time) per optimizer
    step on one GPU, seconds.

    Each GPU runs global_batch / (seq x micro_batch x dp x ep) micro-batches a step (the
    sequence replicas are dp x ep), each through its L/pp layers.
    CP (`network.ring_attention_exposed_s`): a chunk is the rank's seq/cp x micro_batch tokens'
    K and V (split over the tensor-parallel ranks like the heads); the ring runs over NVLink
    when tp x cp GPUs fit in a node, else over the network; it hides behind the block of
    attention each step computes at the planned MFU.
    EP (`network.all_to_all_s`): per MoE layer and micro-batch a dispatch and a combine
    forward and the same two backward (the backward of a dispatch is a combine: DeepEP
    docs), two more with full recomputation; each rank sends its seq/(cp x tp) x micro_batch
    tokens (sequence parallel with tensor parallelism, as Megatron-Core MoE requires); dispatch
    in fp8 with fp8 training (DeepSeek-V3, arXiv:2412.19437, Sec. 3.3), else bf16; combine
    in bf16. ep_per_node: EP ranks are tp x cp apart, so gpus_per_node / (tp x cp) of them
    share a node's NVLink. Not overlapped with compute (Megatron-LM's default; DeepSeek-V3's
    DualPipe hides it).
    """
    m = r.model
    if lay.cp <= 1 and (lay.ep <= 1 or not m.moe_layers):
        return 0.0, 0.0
    links = gpu_links(r.gpu, a, r.node_network_gb_s, r.gpus_per_node, ranks=2)
    micro = r.global_batch_tokens / (r.sequence_length * r.micro_batch * lay.dp * lay.ep)
    full = r.checkpointing == "full"
    cp_s = ep_s = 0.0
    if lay.cp > 1:
        tokens = r.sequence_length / lay.cp * r.micro_batch
        split = lay.tp if m.mla else m.kv_shards(lay.tp)
        chunk = tokens * _cp_kv_bytes_per_token_layer(m) / split
        flops = attention_flops_per_token(m, r.sequence_length) / 3 / m.layers * tokens / lay.tp
        fwd_attention = flops / (r.gpu.peak_flops(r.precision) * mfu)
        across = lay.tp * lay.cp > r.gpus_per_node
        _, exposed = ring_attention_exposed_s(
            chunk, lay.cp, links.rate(across), links.alpha_s, fwd_attention, recompute=full
        )
        cp_s = micro * m.layers / lay.pp * exposed
    if lay.ep > 1 and m.moe_layers:
        links = gpu_links(r.gpu, a, r.node_network_gb_s, r.gpus_per_node, ranks=lay.ep)
        tokens = r.sequence_length / (lay.cp * lay.tp) * r.micro_batch
        per_node = max(1, r.gpus_per_node // (lay.tp * lay.cp))

        def a2a(bytes_per_value: float) -> float:
            return all_to_all_s(
                tokens,
                m.hidden_size,
                bytes_per_value,
                m.experts,
                m.active_experts,
                lay.ep,
                per_node,
                links,
            )

        dispatch = a2a(1 if r.precision == "fp8" else 2)
        combine = a2a(2)
        per_layer = dispatch + combine + 2 * combine + (dispatch + combine if full else 0.0)
        ep_s = micro * m.moe_layers / lay.pp * per_layer
    return cp_s, ep_s


def _fitting_from(r: TrainRequest, a: Assumptions, n: int, tries: int = 64):
    """(n, layout), or the next GPU count up (whole nodes, or whole fixed groups) whose
    layouts fit: a count with few factors of two (34 nodes = 16 x 17 GPUs) admits no
    split into the powers of two that parallel sizes take."""
    step = max(r.gpus_per_node if n >= r.gpus_per_node else 1, fixed_group(r))
    first = choose_layout(r, a, n)
    if first is None or first.fits:
        return n, first
    for k in range(1, tries + 1):
        layout = choose_layout(r, a, n + k * step)
        if layout is not None and layout.fits:
            return n + k * step, layout
    return n, first


def plan_training(r: TrainRequest, a: Assumptions) -> TrainPlan:
    """GPUs (given, or enough for the target duration, or the fewest that fit), layout, time.
    Step time: compute at the planned MFU plus what context and expert parallelism add
    (`parallel_comm_per_step`), or the gradient sync over the network when that is longer."""
    flops = training_flops(r)
    peak = r.gpu.peak_flops(r.precision)
    mfu = run_mfu(r, a)
    gpus_for_target = None
    if r.target_seconds:
        gpus_for_target = math.ceil(flops / (r.target_seconds * a.goodput * peak * mfu))
    if r.gpus:
        n = r.gpus
        layout = choose_layout(r, a, n)
    else:
        n = max(_min_fitting_gpus(r, a), round_gpus(gpus_for_target or 1, r.gpus_per_node))
        group = fixed_group(r)
        n = math.ceil(n / group) * group
        n, layout = _fitting_from(r, a, n)
    nodes = math.ceil(n / r.gpus_per_node)
    trainable, _ = trainable_and_frozen(r)
    steps = max(1, math.ceil(r.tokens / r.global_batch_tokens))
    step_compute = flops_per_token(r) * r.global_batch_tokens / (n * peak * mfu)
    mp = layout.tp * layout.pp if layout else 1
    ep = layout.ep if layout else 1
    strategy = layout.strategy if layout else "ddp"
    experts, _ = expert_split(r)
    sync = gradient_sync(trainable - experts, nodes, r.gpus_per_node, mp, strategy)
    sync += gradient_sync(experts, nodes, r.gpus_per_node, mp * ep, strategy)
    comm_s = sync / (r.node_network_gb_s * 1e9 * a.network_efficiency) if sync else 0.0
    cp_s, ep_s = parallel_comm_per_step(r, a, layout, mfu) if layout else (0.0, 0.0)
    seconds = steps * max(step_compute + cp_s + ep_s, comm_s) / a.goodput
    notes = []
    if layout and not layout.fits:
        notes.append("does not fit in GPU memory with any layout of these GPUs")
    if r.gpus and gpus_for_target and r.gpus < gpus_for_target:
        notes.append(f"the target duration needs about {gpus_for_target} GPUs")
    if layout and cp_s > 0.05 * step_compute:
        where = "the network" if layout.tp * layout.cp > r.gpus_per_node else "NVLink"
        notes.append(
            f"context parallel {layout.cp}: the KV ring over {where} is not hidden by "
            f"attention and adds {cp_s / step_compute:.0%} to each step; a longer sequence per "
            "rank (fewer context-parallel ranks) or a ring inside one node hides it"
        )
    if layout and ep_s > 0.05 * step_compute:
        span = layout.ep * layout.tp * layout.cp > r.gpus_per_node
        where = "crosses nodes" if span else "stays inside a node"
        notes.append(
            f"expert parallel {layout.ep}: the all-to-all dispatch and combine ({where}) add "
            f"{ep_s / step_compute:.0%} to each step"
        )
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
        step_cp_s=cp_s,
        step_ep_s=ep_s,
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
