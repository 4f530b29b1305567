"""Checks of a plan that need the catalog: errors for inputs that cannot work, warnings for
inputs that are implausible. Each finding is (spec field path, message); messages name
every field they involve and say which values are defaults.

Errors (the plan is refused): `context_length` under prompt + output tokens or over the
model's `max_context`; `tensor_parallel` that does not split the attention and KV heads
evenly (vLLM and Megatron-LM shard heads over tensor-parallel ranks); `pipeline_parallel`
over the layer count; a fixed `gpus` that is not a multiple of tensor x pipeline x context x
expert parallel; `context_parallel` that does not cut the sequence into 2·cp equal chunks;
`expert_parallel` on a dense model or one that does not divide the experts (serving: also
not equal to `tensor_parallel`, wider than a node, or not splitting the heads);
`params` no bigger than the embeddings alone; a global batch under one sequence.

Warnings (the plan is made, the report lists them): training longer than `max_context`,
tensor parallelism across nodes, a global batch with fewer sequences than data-parallel
ranks, a global batch over 64M tokens, `params` far from the shape's count, an MFU above
what published runs reach, the older field name `kv_precision`.
"""

from __future__ import annotations

import math
from dataclasses import replace

from aicluster.planner.hardware import ModelShape, NodeShape
from aicluster.planner.memory import param_counts
from aicluster.planner.spec import PlanSpec, ServeWorkload, TrainWorkload

Finding = tuple[str, str]

MAX_PLAUSIBLE_BATCH_TOKENS = 2**26  # 64M; the largest published runs use 4M-16M tokens
MAX_PLAUSIBLE_MFU = 0.6  # PaLM 46%, Llama 3 38-43% (Dubey et al. 2024, Table 4)
PARAMS_RATIO_WARN = 2.0  # `params` over 2x (or under 1/2) the shape's count


def count(x: float) -> str:
    """A count as people write it: 1.05B, 16.8M, 4096."""
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:,.0f}" if x >= 10000 else f"{x:g}"


def given(w: ServeWorkload | TrainWorkload, name: str) -> str:
    """`prompt_tokens 3000` when the spec sets it, `prompt_tokens (default 1000)` when not."""
    value = getattr(w, name)
    shown = count(value) if isinstance(value, float) else value
    return f"{name} {shown}" if name in w.model_fields_set else f"{name} (default {shown})"


def _tp_values(m: ModelShape, limit: int) -> str:
    return ", ".join(str(t) for t in range(1, max(1, limit) + 1) if m.splits_heads(t))


def parallel_findings(
    w: ServeWorkload | TrainWorkload, where: str, m: ModelShape, node: NodeShape
) -> tuple[list[Finding], list[Finding]]:
    """tensor_parallel against the heads and the node, pipeline_parallel against the layers."""
    errors: list[Finding] = []
    warnings: list[Finding] = []
    tp, pp = w.tensor_parallel, w.pipeline_parallel
    if tp and not m.splits_heads(tp):
        if m.attention_heads % tp:
            why = f"attention_heads {m.attention_heads} is not a multiple of tensor_parallel {tp}"
        else:
            why = (
                f"kv_heads {m.n_kv_heads} is neither a multiple nor a divisor of "
                f"tensor_parallel {tp}"
            )
        errors.append(
            (
                f"{where}.tensor_parallel",
                f"{why} ({m.name}); tensor parallelism splits the heads evenly over the GPUs: "
                f"use one of {_tp_values(m, max(node.gpus, 8))}",
            )
        )
    elif tp and tp > node.gpus:
        warnings.append(
            (
                f"{where}.tensor_parallel",
                f"tensor_parallel {tp} spans more than one node ({node.gpus} GPUs each): every "
                "layer's all-reduce crosses the network; use pipeline_parallel across nodes",
            )
        )
    if pp and pp > m.layers:
        errors.append(
            (
                f"{where}.pipeline_parallel",
                f"pipeline_parallel {pp} is more than the {m.layers} layers of {m.name}: "
                "each pipeline stage needs at least one layer",
            )
        )
    return errors, warnings


def serve_findings(
    w: ServeWorkload, where: str, m: ModelShape, node: NodeShape, model_where: str
) -> tuple[list[Finding], list[Finding]]:
    errors, warnings = parallel_findings(w, where, m, node)
    need = w.prompt_tokens + w.output_tokens
    demand = f"{given(w, 'prompt_tokens')} + {given(w, 'output_tokens')} = {need}"
    if w.context_length is not None and w.context_length < need:
        errors.append(
            (
                f"{where}.context_length",
                f"context_length {w.context_length} is less than {demand}; "
                "raise context_length or set prompt_tokens and output_tokens",
            )
        )
    context = w.context_length or need
    if m.max_context and context > m.max_context:
        what = (
            f"context_length {context}"
            if w.context_length
            else f"the default context_length, {demand},"
        )
        field = f"{where}.context_length" if w.context_length else where
        errors.append(
            (
                field,
                f"{what} is over max_context {m.max_context} of {m.name} "
                f"({model_where}.max_context); serve a model with a longer context, or set "
                f"{model_where}.max_context if its context was extended",
            )
        )
    errors += expert_findings(w, where, m, model_where)
    ep, tp = w.expert_parallel, w.tensor_parallel
    if ep and ep > 1 and m.is_moe and not m.experts % ep:
        if tp and tp != ep:
            errors.append(
                (
                    f"{where}.expert_parallel",
                    f"expert_parallel {ep} differs from tensor_parallel {tp}: a replica splits "
                    "its experts over its tensor-parallel ranks (vLLM's --enable-expert-parallel"
                    f"); use expert_parallel {tp}, or leave tensor_parallel unset",
                )
            )
        elif ep > node.gpus:
            errors.append(
                (
                    f"{where}.expert_parallel",
                    f"expert_parallel {ep} is more than the {node.gpus} GPUs of a "
                    f"{node.name}: a serving replica keeps its experts in one node (expert "
                    "parallelism across nodes with data-parallel attention is not planned)",
                )
            )
        elif not tp and not m.splits_heads(ep):
            errors.append(
                (
                    f"{where}.expert_parallel",
                    f"expert_parallel {ep} sets tensor_parallel {ep}, which does not split the "
                    f"heads of {m.name} (attention_heads {m.attention_heads}, kv_heads "
                    f"{m.n_kv_heads}): use one of {_tp_values(m, node.gpus)} that divides "
                    f"the {m.experts} experts",
                )
            )
    if w.kv_precision is not None:
        warnings.append(
            (f"{where}.kv_precision", "kv_precision is the older name of kv_cache_dtype")
        )
    return errors, warnings


def train_findings(
    w: TrainWorkload, where: str, m: ModelShape, node: NodeShape, model_where: str
) -> tuple[list[Finding], list[Finding]]:
    errors, warnings = parallel_findings(w, where, m, node)
    errors += context_expert_findings(w, where, m, model_where)
    sizes = {
        "tensor_parallel": w.tensor_parallel,
        "pipeline_parallel": w.pipeline_parallel,
        "context_parallel": w.context_parallel,
        "expert_parallel": w.expert_parallel,
    }
    parts = [f"{name} {v}" for name, v in sizes.items() if v]
    group = math.prod(v for v in sizes.values() if v)
    if w.gpus and parts and w.gpus % group:
        shown = " x ".join(parts) + (f" = {group}" if len(parts) > 1 else "")
        lower = max(group, w.gpus // group * group)
        errors.append(
            (
                f"{where}.gpus",
                f"gpus {w.gpus} is not a multiple of {shown}: each data-parallel replica "
                f"takes {group} GPUs; use gpus {lower} or {lower + group}",
            )
        )
    seq = w.sequence_length
    if m.max_context and seq > m.max_context:
        warnings.append(
            (
                f"{where}.sequence_length",
                f"sequence_length {seq} is over max_context {m.max_context} of {m.name} "
                f"({model_where}.max_context): this extends the model's context (position "
                "scaling must be configured)",
            )
        )
    batch = w.global_batch_tokens
    if batch is not None and batch < seq * w.micro_batch:
        errors.append(
            (
                f"{where}.global_batch_tokens",
                f"global_batch_tokens {count(batch)} is less than one micro-batch: "
                f"{given(w, 'sequence_length')} x {given(w, 'micro_batch')} = "
                f"{seq * w.micro_batch} tokens",
            )
        )
    elif batch is not None and batch > MAX_PLAUSIBLE_BATCH_TOKENS:
        warnings.append(
            (
                f"{where}.global_batch_tokens",
                f"global_batch_tokens {count(batch)} is implausibly large (published runs use "
                "4M-16M tokens per step; Llama 3 405B reached 16M)",
            )
        )
    return errors, warnings


def context_expert_findings(
    w: TrainWorkload, where: str, m: ModelShape, model_where: str
) -> list[Finding]:
    """context_parallel against the sequence, expert_parallel against the experts."""
    errors: list[Finding] = []
    cp = w.context_parallel
    if cp and cp > 1 and w.sequence_length % (2 * cp):
        seq = w.sequence_length
        lower = max(2 * cp, seq // (2 * cp) * 2 * cp)
        fits = [str(c) for c in (1, 2, 4, 8, 16, 32, 64) if c == 1 or seq % (2 * c) == 0]
        errors.append(
            (
                f"{where}.context_parallel",
                f"{given(w, 'sequence_length')} is not a multiple of 2 x context_parallel "
                f"{cp} = {2 * cp}: context parallelism cuts each sequence into 2 x "
                "context_parallel equal chunks, two per rank, to balance the causal mask "
                f"(Megatron-LM); use sequence_length {lower} or {lower + 2 * cp}, or "
                f"context_parallel one of {', '.join(fits)}",
            )
        )
    return errors + expert_findings(w, where, m, model_where)


def expert_findings(
    w: ServeWorkload | TrainWorkload, where: str, m: ModelShape, model_where: str
) -> list[Finding]:
    """expert_parallel against the model's experts."""
    errors: list[Finding] = []
    ep = w.expert_parallel
    if ep and ep > 1 and not m.is_moe:
        errors.append(
            (
                f"{where}.expert_parallel",
                f"expert_parallel {ep} needs a mixture-of-experts model: {m.name} has no "
                f"experts ({model_where}.experts is {m.experts}); leave expert_parallel unset",
            )
        )
    elif ep and m.is_moe and m.experts % ep:
        fits = ", ".join(str(e) for e in range(1, m.experts + 1) if m.experts % e == 0)
        errors.append(
            (
                f"{where}.expert_parallel",
                f"expert_parallel {ep} does not divide the {m.experts} experts of {m.name} "
                f"({model_where}.experts): every rank holds experts / expert_parallel of "
                f"them; use one of {fits}",
            )
        )
    return errors


def model_findings(m: ModelShape, model_where: str) -> tuple[list[Finding], list[Finding]]:
    """`params` against the count the shape gives."""
    if not m.params:
        return [], []
    shape = param_counts(replace(m, params=None))
    emb = shape.embedding + shape.lm_head
    head = "tied" if m.tied_embeddings else "embedding and untied LM head"
    if m.params <= emb + shape.norms:
        copies = 1 if m.tied_embeddings else 2
        return [
            (
                f"{model_where}.params",
                f"params {count(m.params)} is not more than the embeddings alone: vocab_size "
                f"{m.vocab_size} x hidden_size {m.hidden_size} x {copies} ({head}) = "
                f"{count(emb)}; check params, vocab_size and hidden_size",
            )
        ], []
    ratio = m.params / shape.total
    if ratio > PARAMS_RATIO_WARN or ratio < 1 / PARAMS_RATIO_WARN:
        return [], [
            (
                f"{model_where}.params",
                f"params {count(m.params)} is {ratio:.2g}x the {count(shape.total)} that layers, "
                "hidden_size, attention_heads, intermediate_size and vocab_size give; "
                "the planner scales the layers' weights to params",
            )
        ]
    return [], []


def constraint_findings(spec: PlanSpec) -> list[Finding]:
    mfu = spec.constraints.mfu
    if mfu is not None and mfu > MAX_PLAUSIBLE_MFU:
        return [
            (
                "constraints.mfu",
                f"mfu {mfu:g} is above what published large runs reach (PaLM 0.46, "
                "Llama 3 0.38-0.43): training time is likely underestimated",
            )
        ]
    return []


def batch_finding(
    where: str, batch_tokens: float, seq: int, micro_batch: int, dp: int, gpus: int
) -> Finding | None:
    """A step must give every data-parallel rank at least one micro-batch of sequences."""
    sequences = batch_tokens / seq
    if sequences >= dp * micro_batch:
        return None
    return (
        f"{where}.global_batch_tokens",
        f"global_batch_tokens {count(batch_tokens)} is {sequences:,.0f} sequences of {seq} "
        f"tokens per step, fewer than the {dp:,} data-parallel ranks x micro_batch "
        f"{micro_batch} on {gpus:,} GPUs: most GPUs would idle; raise global_batch_tokens to "
        f"at least {count(dp * micro_batch * seq)} or use fewer GPUs",
    )
