"""Serving arithmetic: does a model fit, on how many GPUs, how fast, how many replicas.

Vocabulary: a replica runs one copy of the model on tp x pp GPUs (tensor parallel inside a
node, pipeline stages across nodes). `B` is the decode batch (sequences in flight).
TTFT is time to first token (prefill), TPOT time per output token (one decode step).

Model (the roofline of Williams et al. 2009, "Roofline: an insightful visual performance
model", applied to transformers as in Pope et al. 2022, "Efficiently Scaling Transformer
Inference", arXiv:2211.05102, Sec. 2-3):
- a decode step reads every active weight once plus the batch's KV cache, and does
  2 FLOPs per active parameter per sequence plus the attention over its context
  (Kaplan et al. 2020, arXiv:2001.08361, Table 1: C_forward = 2N + 2·L·n_ctx·d_attn);
  its time is the larger of bytes / (bandwidth) and FLOPs / (peak FLOP/s);
- every forward step pays a fixed cost per layer (`step_overhead_per_layer_us`) plus one
  per step (`step_overhead_us`, the engine's CPU work) and, with tensor parallelism t, 2
  all-reduces per layer of alpha + beta·bytes (alpha = `allreduce_latency_us` at t = 4,
  `allreduce_latency_per_doubling_us` more per doubling; beta over NVLink x
  `nvlink_efficiency`);
- expert parallelism in serving (`expert_parallel` = t, vLLM's --enable-expert-parallel):
  each of the t ranks holds E/t whole routed experts instead of 1/t of every expert; an MoE
  layer's all-reduce becomes a dispatch and a combine all-to-all (`network.all_to_all_s`)
  and an all-gather; a decode step lasts as long as the rank that must read the most
  touched experts (`busiest_rank_experts`), so at small batch EP reads more than TP;
- a prefill of P tokens is the same forward pass over P tokens: compute-bound;
- under load (B-1)/O of the steps also carry a prompt's prefill (`loaded_tpot_s`); such a
  step reads the weights once for both (`mixed_step_s`), so TPOT at batch B is
  step(B) + ((B-1)/O)·(mixed(B, P) - step(B)); a replica serves B / (ttft + O · TPOT) requests/s.
Units: seconds, bytes, FLOPs. Calibration: the per-layer and all-reduce fixed costs are
fitted to one NVIDIA NIM point and the NeMo TP sweep (see `Assumptions`); tests check the
other published points (tests/unit/test_planner_latency.py); a Python-scheduled engine's
per-step cost (`step_overhead_us`) and an MoE model's decode against vLLM's benchmark are in
tests/unit/test_planner_moe_serving.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from aicluster.planner.assumptions import Assumptions
from aicluster.planner.hardware import GIB, Gpu, ModelShape
from aicluster.planner.memory import (
    bytes_per_param,
    kv_bytes_per_token,
    kv_tokens,
    param_counts,
    weight_bytes,
)
from aicluster.planner.network import Links, all_to_all_s


@dataclass(frozen=True)
class ServeRequest:
    name: str
    model: ModelShape
    gpu: Gpu
    gpus_per_node: int
    precision: str = "bf16"
    kv_precision: str = "bf16"
    context_length: int = 4096
    prompt_tokens: int = 1000
    output_tokens: int = 250
    requests_per_second: float | None = None
    concurrent_users: int | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    tensor_parallel: int | None = None
    pipeline_parallel: int | None = None
    expert_parallel: int = 1
    min_replicas: int = 1


@dataclass(frozen=True)
class ServeOption:
    """One (tp, pp) layout evaluated for a request."""

    tp: int
    pp: int
    fits: bool
    weights_per_gpu: float
    kv_capacity_tokens: float
    max_batch: int
    batch: int
    ttft_s: float
    tpot_s: float
    tpot_batch1_s: float
    replica_rps: float
    replica_tokens_per_s: float
    replicas: int
    latency_ok: bool
    memory_per_gpu: dict[str, float] = field(default_factory=dict)
    ep: int = 1

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def total_gpus(self) -> int:
        return self.replicas * self.gpus_per_replica


@dataclass(frozen=True)
class ServePlan:
    request: ServeRequest
    params: float
    active_params: float
    weight_bytes: float
    kv_bytes_per_token: float
    kv_bytes_per_sequence: float
    chosen: ServeOption | None
    options: tuple[ServeOption, ...]
    notes: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        return self.chosen is not None and self.chosen.fits


def _tp_candidates(m: ModelShape, gpus_per_node: int) -> list[int]:
    """Powers of two up to a node that split the heads evenly (`ModelShape.splits_heads`)."""
    out, tp = [], 1
    while tp <= max(1, gpus_per_node):
        if m.splits_heads(tp):
            out.append(tp)
        tp *= 2
    return out or [1]


def weights_read_per_step(m: ModelShape, precision: str, batch: int) -> float:
    """Bytes of weights a decode step of `batch` sequences reads.

    Dense: all of them. MoE with E routed experts, k active, uniform routing (assumption): a
    layer's expert is untouched by all B tokens with probability (1 - k/E)^B, so the step
    reads the rest (attention, shared experts, dense layers, embeddings) + routed expert
    weights x (1 - (1 - k/E)^B).
    """
    total = weight_bytes(m, precision)
    if not m.is_moe:
        return total
    routed = param_counts(m).routed * bytes_per_param(precision)
    touched = 1 - (1 - m.active_experts / m.experts) ** max(1, batch)
    return total - routed + routed * touched


def busiest_rank_experts(experts: int, active: int, batch: int, ep: int) -> float:
    """Expected routed experts of one MoE layer that the busiest of `ep` ranks reads in a
    step of `batch` tokens, each rank holding m = experts/ep whole experts.

    Uniform routing (assumption, as `weights_read_per_step`): an expert is touched with
    probability q = 1 - (1 - k/E)^B; a rank's count is taken as Binomial(m, q) (experts
    independent, an approximation) and the busiest of ep ranks as the maximum of ep such
    counts: E[max] = sum over j < m of 1 - F(j)^ep, F the binomial CDF. ep = 1 gives E·q.
    Mixtral (E 8, k 2) at EP 8 and batch 1: one whole expert on the busiest rank (this
    approximation: 1 - (3/4)^8 = 0.90), where tensor parallelism reads 2/8 of one per rank."""
    q = 1 - (1 - active / experts) ** max(1, batch)
    m = experts // max(1, ep)
    if ep <= 1:
        return experts * q
    pmf = [math.comb(m, j) * q**j * (1 - q) ** (m - j) for j in range(m + 1)]
    cdf, busiest = 0.0, 0.0
    for j in range(m):
        cdf += pmf[j]
        busiest += 1 - min(1.0, cdf) ** ep
    return busiest


def weights_read_per_gpu(m: ModelShape, precision: str, batch: int, tp: int, ep: int = 1) -> float:
    """Bytes of weights the slowest of a replica's tensor-parallel ranks reads in a step of
    `batch` tokens: 1/tp of `weights_read_per_step`, or with expert parallelism (ep = tp) 1/tp
    of the rest and the busiest rank's whole experts (`busiest_rank_experts`)."""
    if ep <= 1 or not m.is_moe:
        return weights_read_per_step(m, precision, batch) / tp
    routed = param_counts(m).routed * bytes_per_param(precision)
    rest = weight_bytes(m, precision) - routed
    one_expert = routed / m.experts  # one expert index over every MoE layer
    return rest / tp + one_expert * busiest_rank_experts(m.experts, m.active_experts, batch, ep)


def forward_flops_per_token(m: ModelShape, context: float, absorbed: bool = False) -> float:
    """2·N_active + 2·L·n_ctx·d_attn (Kaplan et al. 2020, Table 1), d_attn the model's
    attention width (`ModelShape.attention_width`; MLA decoding with the absorbed
    up-projections when `absorbed`); a sliding-window layer attends to at most the window."""
    n_active = param_counts(m).active
    width = m.attention_width(absorbed)
    return 2 * n_active + 2 * m.layers * kv_tokens(m, context) * width


def _tp_comm_s(r: ServeRequest, a: Assumptions, tp: int, tokens: float) -> float:
    """Two all-reduces of tokens·h·2 bytes per layer (Megatron-LM TP, Shoeybi et al. 2019,
    Sec. 3), each alpha + beta·bytes: alpha = `Assumptions.collective_latency_s(tp)` (grows
    with log2 tp), beta the ring cost 2(t-1)/t over NVLink (per direction = half the total)
    or PCIe x `nvlink_efficiency`.

    With expert parallelism (ep = tp) an MoE layer keeps the attention's all-reduce and
    replaces the MLP's by a dispatch and a combine (`network.all_to_all_s`: each rank sends
    its tokens/tp, in 16 bits, once to each rank holding one of their experts, over NVLink)
    and an all-gather of the tokens for the next attention ((t-1)/t of tokens·h·2 bytes)."""
    m, gpu = r.model, r.gpu
    if tp <= 1:
        return 0.0
    link = (gpu.nvlink_gb_s / 2 if gpu.nvlink_gb_s else gpu.pcie_gb_s) * 1e9 * a.nvlink_efficiency
    alpha = a.collective_latency_s(tp)
    act = tokens * m.hidden_size * 2
    per_call = alpha + 2 * (tp - 1) / tp * act / link
    ep = r.expert_parallel
    if ep <= 1 or not m.moe_layers:
        return 2 * m.layers * per_call
    links = Links(nvlink_b_s=link, network_b_s=link, alpha_s=a.collective_latency_s(ep))
    a2a = all_to_all_s(tokens / tp, m.hidden_size, 2, m.experts, m.active_experts, ep, ep, links)
    gather = alpha + (tp - 1) / tp * act / link
    moe = m.moe_layers
    return (2 * (m.layers - moe) + moe) * per_call + moe * (2 * a2a + gather)


def _step_overhead_s(m: ModelShape, a: Assumptions) -> float:
    """Fixed cost of one forward step: `step_overhead_per_layer_us` x layers +
    `step_overhead_us`."""
    return (m.layers * a.step_overhead_per_layer_us + a.step_overhead_us) * 1e-6


def decode_step_s(
    r: ServeRequest, a: Assumptions, tp: int, batch: int, context: float | None = None
) -> float:
    """One decode step of `batch` sequences: the fixed per-layer cost, plus the larger of
    memory time (weights + the batch's KV cache at `context` tokens, default the average
    while decoding) and compute time, plus the tensor-parallel all-reduces."""
    if context is None:
        context = r.prompt_tokens + r.output_tokens / 2
    kv = batch * kv_tokens(r.model, context) * kv_bytes_per_token(r.model, r.kv_precision)
    ep = r.expert_parallel if tp > 1 else 1
    per_gpu = weights_read_per_gpu(r.model, r.precision, batch, tp, ep) + kv / tp
    mem_s = per_gpu / (r.gpu.memory_bandwidth_gb_s * 1e9 * a.bandwidth_efficiency)
    flops = batch * forward_flops_per_token(r.model, context, absorbed=True)
    peak = r.gpu.peak_flops(r.precision) * tp * a.prefill_efficiency
    return _step_overhead_s(r.model, a) + max(mem_s, flops / peak) + _tp_comm_s(r, a, tp, batch)


def prefill_s(r: ServeRequest, a: Assumptions, tp: int) -> float:
    """Compute-bound forward over the prompt (average context P/2), at least one weight read,
    plus the fixed step cost and the all-reduces of P tokens."""
    p = r.prompt_tokens
    flops = p * forward_flops_per_token(r.model, p / 2)
    compute = flops / (r.gpu.peak_flops(r.precision) * tp * a.prefill_efficiency)
    weights = weight_bytes(r.model, r.precision) / (
        tp * r.gpu.memory_bandwidth_gb_s * 1e9 * a.bandwidth_efficiency
    )
    return _step_overhead_s(r.model, a) + max(compute, weights) + _tp_comm_s(r, a, tp, p)


def mixed_step_s(r: ServeRequest, a: Assumptions, tp: int, batch: int) -> float:
    """One forward step that carries a whole prompt's prefill with the decode of `batch`
    sequences, as in-flight batching (TensorRT-LLM) and chunked prefill (Agrawal et al.
    2024, Sarathi-Serve, OSDI: decodes piggyback on prefill chunks) schedule them: one fixed
    per-layer cost, one read of the weights and the batch's KV cache that the prefill's
    compute hides, the FLOPs of both, and all-reduces of batch + P tokens with one alpha each."""
    m, p = r.model, r.prompt_tokens
    context = r.prompt_tokens + r.output_tokens / 2
    kv = batch * kv_tokens(m, context) * kv_bytes_per_token(m, r.kv_precision)
    ep = r.expert_parallel if tp > 1 else 1
    per_gpu = weights_read_per_gpu(m, r.precision, max(batch, p), tp, ep) + kv / tp
    mem_s = per_gpu / (r.gpu.memory_bandwidth_gb_s * 1e9 * a.bandwidth_efficiency)
    flops = batch * forward_flops_per_token(m, context, absorbed=True)
    flops += p * forward_flops_per_token(m, p / 2)
    compute = flops / (r.gpu.peak_flops(r.precision) * tp * a.prefill_efficiency)
    return _step_overhead_s(m, a) + max(mem_s, compute) + _tp_comm_s(r, a, tp, batch + p)


def loaded_tpot_s(r: ServeRequest, a: Assumptions, tp: int, batch: int) -> float:
    """Time between a sequence's tokens with `batch` sequences in flight, in steady state:
    the decode step, plus the other sequences' prefills that interleave with it. While one
    sequence makes O tokens, each of the other B - 1 in flight is replaced once, so a
    fraction f = (B - 1)/O of the steps carries a prefill (continuous batching, Yu et al.
    2022, Orca, OSDI). Such a step is `mixed_step_s`, not a decode step plus a separate
    prefill: the prefill's compute hides the step's weight and KV reads and shares its fixed
    costs. Average: step(B) + f x (mixed(B) - step(B)); chunked prefill spreads the same
    GPU time over more steps."""
    others = max(0, batch - 1)
    step = decode_step_s(r, a, tp, batch)
    if not others:
        return step
    return step + others / r.output_tokens * (mixed_step_s(r, a, tp, batch) - step)


def _largest_batch(r: ServeRequest, a: Assumptions, tp: int, limit: int) -> int:
    """Largest B <= limit whose decode step meets the TPOT target (step time grows with B)."""
    if limit < 1:
        return 0
    if r.tpot_s is None:
        return limit
    if loaded_tpot_s(r, a, tp, 1) > r.tpot_s:
        return 0
    lo, hi = 1, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if loaded_tpot_s(r, a, tp, mid) <= r.tpot_s:
            lo = mid
        else:
            hi = mid - 1
    return lo


def evaluate(r: ServeRequest, a: Assumptions, tp: int, pp: int) -> ServeOption:
    """Memory, latency and replica count of one layout."""
    m = r.model
    n = tp * pp
    usable = r.gpu.memory_bytes * a.gpu_memory_utilization - engine_reserve_bytes(m, a, tp)
    w_gpu = weight_bytes(m, r.precision) / n
    # K/V heads are split over tp ranks (replicated once tp exceeds kv_heads; MLA's latent on
    # every rank), layers over pp.
    kv_gpu_token = kv_bytes_per_token(m, r.kv_precision) / (m.kv_shards(tp) * pp)
    kv_capacity = max(0.0, usable - w_gpu) / kv_gpu_token
    # KV tokens a sequence keeps (at most the sliding window): the longest, and a typical one
    seq_tokens = kv_tokens(m, r.prompt_tokens + r.output_tokens)
    fits = kv_capacity >= kv_tokens(m, r.context_length) and w_gpu < usable
    max_batch = int(min(kv_capacity // max(1, seq_tokens), a.max_num_seqs)) if fits else 0
    batch = _largest_batch(r, a, tp, max_batch)
    latency_batch = max(1, batch)
    ttft = prefill_s(r, a, tp)
    tpot1 = decode_step_s(r, a, tp, 1)
    tpot = loaded_tpot_s(r, a, tp, latency_batch)
    latency_ok = batch >= 1 and (r.ttft_s is None or ttft <= r.ttft_s)
    # B requests finish every prefill + O loaded steps (the others' prefills are inside TPOT)
    rps = latency_batch / (ttft + r.output_tokens * tpot) if fits else 0.0
    replicas = _replicas(r, a, rps, batch) if fits else 0
    kv_used = min(kv_capacity, latency_batch * seq_tokens) * kv_gpu_token
    overhead = r.gpu.memory_bytes - usable
    return ServeOption(
        tp=tp,
        pp=pp,
        fits=fits,
        weights_per_gpu=w_gpu,
        kv_capacity_tokens=kv_capacity,
        max_batch=max_batch,
        batch=batch,
        ttft_s=ttft,
        tpot_s=tpot,
        tpot_batch1_s=tpot1,
        replica_rps=rps,
        replica_tokens_per_s=latency_batch / tpot if fits else 0.0,
        replicas=replicas,
        latency_ok=latency_ok,
        memory_per_gpu={
            "weights": w_gpu,
            "kv_cache": kv_used,
            "reserved": overhead,
            "free": max(0.0, r.gpu.memory_bytes - w_gpu - kv_used - overhead),
        },
        ep=r.expert_parallel if tp > 1 else 1,
    )


def activation_peak_bytes(m: ModelShape, a: Assumptions) -> float:
    """Peak activation memory of the engine's largest forward, bytes (not split by TP: vLLM
    reports the same peak at TP 1 and 2): N = max_num_batched_tokens tokens through the MLP
    (gate, up and their product: 3·d_ff) and 4·h of hidden/attention buffers in 16 bits, plus
    fp32 logits and probabilities for max_num_seqs sequences (2 x 4 bytes x V). Llama 3 8B:
    8192 x (3 x 14336 + 4 x 4096) x 2 + 256 x 128256 x 8 = 1.15 GiB; vLLM profiles 1.26 GiB."""
    n = a.max_num_batched_tokens
    return n * (3 * m.d_ff + 4 * m.hidden_size) * 2 + a.max_num_seqs * m.vocab_size * 8


def engine_reserve_bytes(m: ModelShape, a: Assumptions, tp: int) -> float:
    """What a serving engine keeps out of its memory budget (gpu_memory_utilization x card)
    besides weights and KV cache: non-PyTorch memory, TP buffers, the activation peak. (The
    1 - gpu_memory_utilization share left unused holds CUDA graphs and fragmentation.)"""
    extra = a.engine_tp_buffers_gib if tp > 1 else 0.0
    return (a.engine_non_torch_gib + extra) * GIB + activation_peak_bytes(m, a)


def _replicas(r: ServeRequest, a: Assumptions, rps: float, batch: int) -> int:
    """Replicas for the demand at the target utilisation, never fewer than min_replicas.

    Rate: ceil(rate / (replica_rps · utilisation)). Concurrent users (each with one request
    in flight): ceil(users / (B · utilisation)).
    """
    need = r.min_replicas
    if r.requests_per_second and rps > 0:
        need = max(need, math.ceil(r.requests_per_second / (rps * a.utilization) - 1e-9))
    if r.concurrent_users and batch > 0:
        need = max(need, math.ceil(r.concurrent_users / (batch * a.utilization) - 1e-9))
    return need


def plan_serving(r: ServeRequest, a: Assumptions, max_pp: int = 16) -> ServePlan:
    """Evaluate every layout and choose the one with the fewest GPUs in total that fits and
    meets the latency targets (ties: fewer GPUs per replica). Pipeline stages are tried only
    with whole nodes of tensor parallelism, when one node cannot hold the model."""
    m = r.model
    if r.tensor_parallel:
        tps = [r.tensor_parallel]
    elif r.expert_parallel > 1:  # the experts are split over the tensor-parallel ranks
        tps = [r.expert_parallel]
    else:
        tps = _tp_candidates(m, r.gpus_per_node)
    layouts = [(tp, r.pipeline_parallel or 1) for tp in tps]
    options = [evaluate(r, a, tp, pp) for tp, pp in layouts]
    if not r.pipeline_parallel and not any(o.fits for o in options):
        tp = max(tps)
        for pp in range(2, max_pp + 1):
            opt = evaluate(r, a, tp, pp)
            options.append(opt)
            if opt.fits:
                break
    fitting = [o for o in options if o.fits]
    good = [o for o in fitting if o.latency_ok] or fitting
    chosen = min(good, key=lambda o: (o.total_gpus, o.gpus_per_replica)) if good else None
    counts = param_counts(m)
    kv_tok = kv_bytes_per_token(m, r.kv_precision)
    notes = []
    if chosen and not chosen.latency_ok:
        notes.append("latency targets are not met by any layout that fits; showing the fastest fit")
    if chosen and chosen.pp > 1:
        notes.append(f"needs {chosen.pp} pipeline stages across nodes (tp={chosen.tp} per node)")
    return ServePlan(
        request=r,
        params=counts.total,
        active_params=counts.active,
        weight_bytes=weight_bytes(m, r.precision),
        kv_bytes_per_token=kv_tok,
        kv_bytes_per_sequence=kv_tok * kv_tokens(m, r.context_length),
        chosen=chosen,
        options=tuple(options),
        notes=tuple(notes),
    )


def throughput_curve(plan: ServePlan, max_replicas: int) -> list[tuple[int, float]]:
    """(replicas, requests/s served at the target utilisation) for charts."""
    if not plan.chosen:
        return []
    per = plan.chosen.replica_rps
    return [(n, n * per) for n in range(1, max(1, max_replicas) + 1)]
