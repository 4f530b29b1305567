"""Context parallelism and expert parallelism (issue 18): spec fields and their checks,
memory divided by CP and EP, the ring's and the all-to-all's alpha-beta costs, the layout
search, and published figures (Llama 3's 128k layout; DeepEP's measured bandwidths)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
from planner_support import plan_of, problems

from aicluster.cli.plan_cmds import load_plan
from aicluster.planner.assumptions import Assumptions
from aicluster.planner.catalog import load_catalog
from aicluster.planner.hardware import Gpu
from aicluster.planner.inputs import resolve
from aicluster.planner.memory import activation_bytes, param_counts
from aicluster.planner.network import (
    Links,
    all_to_all_s,
    expert_rank_probability,
    gpu_links,
    ring_attention_exposed_s,
)
from aicluster.planner.plan import make_plan, plan_to_dict
from aicluster.planner.report import train_rows
from aicluster.planner.spec import load_plan_spec_text
from aicluster.planner.training import (
    TrainRequest,
    choose_layout,
    memory_per_gpu,
    parallel_comm_per_step,
    plan_training,
)
from aicluster.specs import SpecError

CAT = load_catalog()
A = Assumptions()
H100 = CAT.get("gpus", "h100-sxm")
TRAIN = "kind: plan\nname: p\ntrain:\n  - name: t\n    model: {model}\n    tokens: 1B\n"


def request(model="mixtral-8x7b", **kw) -> TrainRequest:
    base = {
        "name": "t",
        "model": CAT.get("models", model),
        "gpu": H100,
        "gpus_per_node": 8,
        "node_network_gb_s": 8 * 50.0,  # 8 x 400 Gb/s (DGX H100)
        "tokens": 1e9,
    }
    base.update(kw)
    return TrainRequest(**base)


# --- the spec and its checks ----------------------------------------------------------


def test_expert_parallel_on_a_dense_model_is_refused(tmp_path):
    found = problems(tmp_path, TRAIN.format(model="llama-3-8b") + "    expert_parallel: 8\n")
    assert found == {
        "train.0.expert_parallel": (
            7,
            "expert_parallel 8 needs a mixture-of-experts model: Meta Llama 3 8B has no "
            "experts (models.llama-3-8b.experts is 1); leave expert_parallel unset",
        )
    }


def test_expert_parallel_must_divide_the_experts(tmp_path):
    found = problems(tmp_path, TRAIN.format(model="mixtral-8x7b") + "    expert_parallel: 3\n")
    assert found == {
        "train.0.expert_parallel": (
            7,
            "expert_parallel 3 does not divide the 8 experts of Mixtral 8x7B "
            "(models.mixtral-8x7b.experts): every rank holds experts / expert_parallel of "
            "them; use one of 1, 2, 4, 8",
        )
    }


def test_context_parallel_must_cut_the_sequence_into_2cp_chunks(tmp_path):
    found = problems(
        tmp_path,
        TRAIN.format(model="llama-3-8b") + "    sequence_length: 6000\n    context_parallel: 16\n",
    )
    assert found == {
        "train.0.context_parallel": (
            8,
            "sequence_length 6000 is not a multiple of 2 x context_parallel 16 = 32: context "
            "parallelism cuts each sequence into 2 x context_parallel equal chunks, two per "
            "rank, to balance the causal mask (Megatron-LM); use sequence_length 5984 or "
            "6016, or context_parallel one of 1, 2, 4, 8",
        )
    }
    # the default sequence length is named as a default
    found = problems(tmp_path, TRAIN.format(model="llama-3-8b") + "    context_parallel: 3\n")
    assert found["train.0.context_parallel"][1].startswith(
        "sequence_length (default 4096) is not a multiple of 2 x context_parallel 3 = 6"
    )


def test_gpus_must_be_a_multiple_of_every_parallel_size(tmp_path):
    found = problems(
        tmp_path,
        TRAIN.format(model="mixtral-8x7b")
        + "    gpus: 24\n    tensor_parallel: 2\n    context_parallel: 2\n    expert_parallel: 4\n",
    )
    assert found["train.0.gpus"][1] == (
        "gpus 24 is not a multiple of tensor_parallel 2 x context_parallel 2 x "
        "expert_parallel 4 = 16: each data-parallel replica takes 16 GPUs; use gpus 16 or 32"
    )


def test_layout_in_json_and_report():
    d = plan_of(
        TRAIN.format(model="mixtral-8x7b")
        + "    gpus: 64\n    expert_parallel: 8\n    context_parallel: 2\n"
    )
    lay = d["train"][0]["layout"]
    assert (lay["expert_parallel"], lay["context_parallel"], lay["data_parallel"]) == (8, 2, 4)
    assert lay["tensor_parallel"] * lay["pipeline_parallel"] == 1
    assert train_rows(d)[0]["layout"].endswith(" cp2 ep8")
    t = d["train"][0]
    assert t["step_expert_parallel_s"] > 0 and t["step_context_parallel_s"] >= 0


# --- memory ---------------------------------------------------------------------------


def test_context_parallel_divides_the_activations():
    # Megatron-LM context parallel docs: "The activation memory footprint per GPU is CP
    # times smaller". Llama 3.1 8B, 128k tokens, selective recomputation, TP 8:
    # 32 x 34 x 131072 x 4096 x 2 B... all over tp, then over cp.
    m = CAT.get("models", "llama-3.1-8b")
    one = activation_bytes(m, 131072, 1, 8, "selective")
    assert one == (32 * 34 * 131072 * 4096 + 131072 * 128256 * 6) / 8
    for cp in (2, 4, 16):
        assert activation_bytes(m, 131072, 1, 8, "selective", cp) == pytest.approx(one / cp)


def test_expert_parallel_divides_only_the_routed_experts():
    # Mixtral 8x7B, full training, DDP, one GPU per data-parallel rank: EP 8 keeps 1/8 of
    # the routed experts' 16 bytes/param (2 weights + 2 grads + 12 Adam with master) and all
    # of the rest: attention, router, embeddings, norms.
    r = request()
    c = param_counts(r.model)
    whole = memory_per_gpu(r, A, "ddp", 1, 1, 1)
    ep8 = memory_per_gpu(r, A, "ddp", 1, 1, 1, ep=8)
    assert whole.weights + whole.gradients + whole.optimizer == pytest.approx(16 * c.total)
    expected = 16 * (c.total - c.routed) + 16 * c.routed / 8
    assert ep8.weights + ep8.gradients + ep8.optimizer == pytest.approx(expected)
    # ZeRO-1: the dense part's states are sharded over dp x ep ranks, the experts' over dp
    z = memory_per_gpu(r, A, "zero1", 2, 1, 1, ep=4)
    dense, routed = c.total - c.routed, c.routed / 4
    assert z.optimizer == pytest.approx(12 * dense / 8 + 12 * routed / 2)


def test_deepseek_v3_fits_its_published_training_layout():
    # DeepSeek-V3 technical report (arXiv:2412.19437) Sec. 3.2: 2048 H800 GPUs, 16-way
    # pipeline, 64-way expert parallelism over 8 nodes, ZeRO-1 data parallelism (so dp 2).
    # The planner's memory for that layout fits in 80 GB (H800 = H100 memory).
    r = request(
        "deepseek-v3",
        sequence_length=4096,
        gpus=2048,
        pipeline_parallel=16,
        expert_parallel=64,
        tensor_parallel=1,
        strategy="zero1",
        global_batch_tokens=15360 * 4096,
    )
    p = plan_training(r, A)
    assert (p.layout.pp, p.layout.ep, p.layout.dp) == (16, 64, 2)
    assert p.fits
    assert p.step_ep_s > 0


# --- communication --------------------------------------------------------------------


def test_all_to_all_volume_with_one_expert_per_token():
    # k = 1: each rank sends tokens x hidden x bytes x (ep-1)/ep (GShard, DeepSpeed-MoE).
    # 4096 tokens x 7168 x 2 B x 7/8 = 51,380,224 B over 160 GB/s NVLink, plus alpha 22 us.
    links = Links(160e9, 40e9, 22e-6)
    t = all_to_all_s(4096, 7168, 2, 8, 1, 8, 8, links)
    assert t == pytest.approx(22e-6 + 4096 * 7168 * 2 * 7 / 8 / 160e9)
    # two nodes of 8 (ep 16): 8/16 of the tokens cross the network at 40 GB/s, 7/16 stay in
    # the node; the network is the bottleneck
    t16 = all_to_all_s(4096, 7168, 2, 16, 1, 16, 8, links)
    assert t16 == pytest.approx(22e-6 + 4096 * 7168 * 2 * 8 / 16 / 40e9)


def test_tokens_go_once_to_each_rank_holding_one_of_their_experts():
    # Mixtral: 8 experts, top-2, EP 8: a rank is needed with probability 1 - C(7,2)/C(8,2)
    # = 1 - 21/28 = 0.25 (so 2 copies per token, 1.75 of them to other ranks)
    assert expert_rank_probability(8, 2, 8) == pytest.approx(0.25)
    # DeepSeek-V3: 256 experts, top-8, EP 8 (32 per rank): 1 - C(224,8)/C(256,8)
    p = expert_rank_probability(256, 8, 8)
    assert p == pytest.approx(1 - math.comb(224, 8) / math.comb(256, 8))
    assert 8 * p == pytest.approx(5.3, abs=0.05)  # 5.3 ranks per token, not 8 copies
    assert expert_rank_probability(256, 8, 1) == 1.0


def test_link_rates_against_deepep_measurements():
    # DeepEP V1 (github.com/deepseek-ai/DeepEP, docs/legacy.md, "Normal kernels"): H800
    # (~160 GB/s NVLink), one CX7 400 Gb/s NIC per GPU, DeepSeek-V3 pre-training setting:
    # intranode EP 8 dispatch 153 GB/s (NVLink); internode EP 16 43 GB/s (RDMA). The
    # planner's rates: NVLink 400/2 x 0.8 = 160 GB/s (+4.6%), the NIC 50 x 0.8 = 40 GB/s
    # (-7%).
    h800 = Gpu("h800", "H800", 80, 3350, 989.4, 700, nvlink_gb_s=400)
    links = gpu_links(h800, A, 8 * 50.0, 8)
    assert links.nvlink_b_s / 1e9 == pytest.approx(153, rel=0.10)
    assert links.network_b_s / 1e9 == pytest.approx(43, rel=0.10)


def test_ring_attention_hides_behind_attention_when_chunks_are_long():
    links = Links(360e9, 40e9, 22e-6)
    # a 1 MB chunk against 10 ms of attention per layer over 4 ranks: nothing exposed
    ring, exposed = ring_attention_exposed_s(1e6, 4, links.network_b_s, links.alpha_s, 10e-3)
    assert ring == pytest.approx(3 * ((22e-6 + 1e6 / 40e9) + (22e-6 + 2e6 / 40e9)))
    assert exposed == 0
    # a 40 MB chunk: forward step 1.022 ms against a 0.25 ms block, backward 2.022 against 0.5
    _, exposed = ring_attention_exposed_s(40e6, 4, 40e9, 22e-6, 1e-3)
    assert exposed == pytest.approx(3 * ((1.022e-3 - 0.25e-3) + (2.022e-3 - 0.5e-3)))


def test_llama_3_405b_long_context_layout():
    # Dubey et al. 2024, The Llama 3 Herd of Models (arXiv:2407.21783) Table 4: 16,384 H100s,
    # TP 8, CP 16, PP 16, DP 8, sequence 131,072, 16M tokens per batch: 380 TFLOPs/GPU
    # (38% BF16 MFU), against 400 at 8,192 tokens with CP 1 (41%). The planner fits that
    # layout in 80 GB, its KV ring (across nodes: TP 8 x CP 16 GPUs) hides behind attention,
    # and the achieved rate is the planned MFU's: 0.40 x 989.4 = 396 TFLOPs/GPU (+4%).
    r = request(
        "llama-3.1-405b",
        sequence_length=131072,
        gpus=16384,
        tensor_parallel=8,
        pipeline_parallel=16,
        context_parallel=16,
        global_batch_tokens=16 * 2**20,
        tokens=1e12,
    )
    p = plan_training(r, A)
    assert (p.layout.tp, p.layout.cp, p.layout.pp, p.layout.dp) == (8, 16, 16, 8)
    assert p.fits
    assert p.step_cp_s == 0
    achieved = p.flops_per_token * r.global_batch_tokens / (p.step_compute_s + p.step_cp_s)
    assert achieved / p.gpus / 1e12 == pytest.approx(380, rel=0.10)
    # without CP the activations of a 128k sequence do not fit
    assert not choose_layout(replace(r, context_parallel=1), A, 16384 // 16).fits


def test_short_sequences_over_many_context_ranks_expose_the_ring():
    # 8k tokens over CP 16 across nodes: 512-token chunks, too little attention to hide
    # the ring; the plan says so and the step is longer than compute alone
    r = request(
        "llama-3.1-70b",
        sequence_length=8192,
        gpus=1024,
        tensor_parallel=8,
        context_parallel=16,
        tokens=1e10,
    )
    p = plan_training(r, A)
    assert p.step_cp_s > 0.05 * p.step_compute_s
    assert any("context parallel 16" in n and "network" in n for n in p.notes)
    seconds = p.steps * (p.step_compute_s + p.step_cp_s) / A.goodput
    assert p.seconds == pytest.approx(seconds)


def test_expert_parallel_step_time_counts_each_all_to_all():
    # Mixtral 8x7B, EP 8 inside a node, 64 GPUs (dp 8), 4M tokens a step of 4096-token
    # sequences: 1024 sequences / (dp 8 x ep 8) = 16 micro-batches per GPU, 32 MoE layers,
    # 4 all-to-alls each (dispatch and combine, forward and backward), 4096 tokens each.
    r = request(gpus=64, expert_parallel=8, tensor_parallel=1, sequence_length=4096)
    p = plan_training(r, A)
    lay = p.layout
    assert (lay.ep, lay.dp) == (8, 8)
    links = gpu_links(H100, A, 400.0, 8, ranks=8)
    one = all_to_all_s(4096, 4096, 2, 8, 2, 8, 8, links)
    assert p.step_ep_s == pytest.approx(16 * 32 * 4 * one)
    # 1.75 copies x 4096 tokens x 4096 x 2 B = 58.7 MB over 360 GB/s: 0.163 ms, plus the
    # alpha of a collective among 8 ranks: 22 + 2.6 us = 24.6 us
    assert one == pytest.approx(24.6e-6 + 1.75 * 4096 * 4096 * 2 / 360e9)
    assert parallel_comm_per_step(r, A, lay, p.mfu) == (0.0, p.step_ep_s)
    # across nodes (TP 2 x EP 8 = 16 GPUs) most copies take the 40 GB/s NIC: slower
    wide = plan_training(replace(r, tensor_parallel=2), A)
    assert wide.step_ep_s > 3 * p.step_ep_s


def test_layout_search_uses_context_parallel_for_long_sequences():
    # Llama 3.1 8B with 128k-token sequences: 8 GPUs of TP 8 cannot hold the activations
    # (97 GiB); on 16 GPUs the search finds TP 8 x CP 2 (57 GiB)
    r = request("llama-3.1-8b", sequence_length=131072, global_batch_tokens=2**24)
    assert not choose_layout(r, A, 8).fits
    lay = choose_layout(r, A, 16)
    assert (lay.tp, lay.cp, lay.fits) == (8, 2, True)
    assert plan_training(r, A).gpus == 16


def test_layout_search_prefers_expert_over_tensor_parallelism_at_equal_degree():
    # Mixtral 8x7B with the distributed optimizer (ZeRO-1, Megatron's default) on 16 H100s:
    # no degree below 8 fits, and at degree 8 the search takes EP 8 before TP 8 (EP keeps
    # the dense matmuls whole; both split the experts 8 ways). ZeRO-3 alone needs neither
    # (every strategy's state is split over all 16 GPUs), so `auto` shards with ZeRO-3.
    lay = choose_layout(request(strategy="zero1"), A, 16)
    assert (lay.tp, lay.pp, lay.cp, lay.ep, lay.dp, lay.fits) == (1, 1, 1, 8, 2, True)
    tp8 = choose_layout(request(strategy="zero1", expert_parallel=1), A, 16)
    assert (tp8.tp, tp8.ep, tp8.fits) == (8, 1, True)
    auto = choose_layout(request(), A, 16)
    assert (auto.strategy, auto.tp * auto.pp * auto.cp * auto.ep) == ("zero3", 1)


def test_gpu_count_steps_up_to_one_that_splits_into_powers_of_two():
    # DeepSeek-V3 with the distributed optimizer (ZeRO-1) in 30 days: the duration alone
    # asks for 34 nodes, 272 = 16 x 17 GPUs, whose splits cannot hold the model; the plan
    # takes the next whole-node count that a layout fits (320 = 64 x 5: TP 8 x EP 8, dp 5)
    r = request("deepseek-v3", strategy="zero1", tokens=1e12, target_seconds=30 * 86400)
    assert not choose_layout(r, A, 272).fits
    p = plan_training(r, A)
    assert p.fits and p.gpus == 320
    assert p.gpus_for_target <= p.gpus
