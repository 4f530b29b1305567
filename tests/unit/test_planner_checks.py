"""Usability of `kind: plan`: each message a user meets names the fields (and defaults)
involved; inline nodes and GPUs; checks against the model; warnings for implausible
inputs; sliding-window attention and the KV cache dtype; the JSON Schema."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import typer
from planner_support import plan_of, problems
from typer.testing import CliRunner

from aicluster.cli import plan_cmds
from aicluster.cli.plan_cmds import load_plan
from aicluster.planner import report as plan_report
from aicluster.planner.catalog import load_catalog
from aicluster.planner.hardware import required_fields
from aicluster.planner.inference import plan_serving
from aicluster.planner.inputs import resolve
from aicluster.planner.memory import kv_bytes_per_sequence, kv_bytes_per_token, kv_tokens
from aicluster.planner.plan import make_plan, plan_to_dict
from aicluster.planner.spec import PlanSpec, load_plan_spec_text
from aicluster.specs import SpecError

CAT = load_catalog()
app = typer.Typer()
plan_cmds.register(app)
app.command("version")(lambda: None)  # a second command keeps typer from flattening `plan`
NAME_WORDS = (
    "use 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit"
)


SERVE = "kind: plan\nname: p\nserve:\n  - name: chat\n    model: llama-3-8b\n"


# --- defaults are named -------------------------------------------------------------


def test_context_length_error_names_the_defaults_and_their_values(tmp_path):
    found = problems(tmp_path, SERVE + "    context_length: 512\n")
    assert found == {
        "serve.0.context_length": (
            6,
            "context_length 512 is less than prompt_tokens (default 1000) + output_tokens "
            "(default 250) = 1250; raise context_length or set prompt_tokens and output_tokens",
        )
    }


def test_context_length_error_shows_given_values_without_default(tmp_path):
    found = problems(tmp_path, SERVE + "    context_length: 512\n    prompt_tokens: 400\n")
    _, message = found["serve.0.context_length"]
    assert "prompt_tokens 400 + output_tokens (default 250) = 650" in message


# --- inline and custom nodes and GPUs -----------------------------------------------


def test_inline_node_where_a_name_is_accepted():
    d = plan_of(
        "kind: plan\nname: p\nhardware:\n  node: {gpu: h100-sxm, gpus: 4, power_w: 5000}\n"
        + SERVE.split("\n", 2)[2]
    )
    assert d["serve"][0]["gpu"] == "NVIDIA H100 SXM5 80GB"
    assert d["pools"][0]["node"] == "custom"
    assert d["pools"][0]["node_name"] == "custom node (4 x h100-sxm)"
    assert d["pools"][0]["gpus"] == 4  # one node of 4


def test_inline_gpu_inside_an_inline_workload_node():
    text = SERVE + (
        "    node:\n"
        "      gpu: {name: A100 80GB PCIe, memory_gib: 80, memory_bandwidth_gb_s: 1935,"
        " bf16_tflops: 312, tdp_w: 300}\n"
        "      gpus: 4\n"
        "      power_w: 3000\n"
    )
    inputs = resolve(load_plan_spec_text(text), CAT)
    req = inputs.serve[0]
    assert req.gpu.name == "A100 80GB PCIe" and req.gpus_per_node == 4
    assert inputs.node_of["chat"].key == "custom-chat"
    # cpus and memory_gib are never read, so a custom node need not give them
    assert inputs.node_of["chat"].cpus is None and inputs.node_of["chat"].memory_gib is None
    assert plan_of(text)["serve"][0]["fits"]


def test_inline_node_of_the_wrong_type_is_one_clear_error(tmp_path):
    found = problems(
        tmp_path, "kind: plan\nname: p\nhardware:\n  node: 8\n" + SERVE.split("\n", 2)[2]
    )
    assert found == {
        "hardware.node": (
            4,
            "expected a catalog node name or an inline node {gpu, gpus, power_w}",
        )
    }
    bad = problems(tmp_path, SERVE + "    node: {gpu: h100-sxm, gpus: four, power_w: 1}\n")
    assert list(bad) == ["serve.0.node.gpus"]


def test_unknown_node_says_how_to_declare_a_custom_one(tmp_path):
    found = problems(
        tmp_path,
        "kind: plan\nname: p\nhardware:\n  node: a100-80gb-nvl\n" + SERVE.split("\n", 2)[2],
    )
    line, message = found["hardware.node"]
    assert line == 4
    assert message.startswith(
        "unknown node 'a100-80gb-nvl'; declare it inline (node: {gpu: <a GPU>, gpus: 8, "
        "power_w: 6000}) or under hardware.nodes.a100-80gb-nvl with gpu, gpus and power_w; "
        "known: dgx-a100, "
    )
    # a catalog GPU named as a node (a100-80gb-pcie is now a catalog GPU) gets the GPU hint
    gpu = problems(
        tmp_path,
        "kind: plan\nname: p\nhardware:\n  node: a100-80gb-pcie\n" + SERVE.split("\n", 2)[2],
    )
    assert gpu["hardware.node"][1].startswith(
        "unknown node 'a100-80gb-pcie'; 'a100-80gb-pcie' is a GPU: give a node with it inline"
    )


def test_gpu_named_as_a_node_points_at_an_inline_node(tmp_path):
    found = problems(
        tmp_path, "kind: plan\nname: p\nhardware:\n  node: l40s\n" + SERVE.split("\n", 2)[2]
    )
    assert (
        "'l40s' is a GPU: give a node with it inline (node: {gpu: l40s"
        in (found["hardware.node"][1])
    )


def test_unknown_gpu_says_how_to_declare_one(tmp_path):
    found = problems(tmp_path, SERVE + "    node: {gpu: b300, gpus: 8, power_w: 14000}\n")
    line, message = found["serve.0.node.gpu"]
    assert line == 6
    assert message.startswith("unknown GPU 'b300'; declare it inline (gpu: {memory_gib: 80,")


def test_every_missing_field_of_a_custom_node_and_gpu_in_one_run(tmp_path):
    text = (
        "kind: plan\nname: p\nhardware:\n  node: mine\n  nodes:\n"
        "    mine: {gpu: {memory_gib: 24}}\n" + SERVE.split("\n", 2)[2]
    )
    found = problems(tmp_path, text)
    assert found == {
        "hardware.nodes.mine": (
            6,
            "incomplete node: missing hardware.nodes.mine.gpus, hardware.nodes.mine.power_w "
            "(a new node needs gpu, gpus, power_w)",
        ),
        "hardware.nodes.mine.gpu": (
            6,
            "incomplete GPU: missing hardware.nodes.mine.gpu.memory_bandwidth_gb_s, "
            "hardware.nodes.mine.gpu.bf16_tflops, hardware.nodes.mine.gpu.tdp_w "
            "(a new GPU needs memory_gib, memory_bandwidth_gb_s, bf16_tflops, tdp_w)",
        ),
    }


def test_required_fields_are_only_those_the_planner_reads():
    assert required_fields("nodes") == ("gpu", "gpus", "power_w")
    assert required_fields("gpus") == (
        "memory_gib",
        "memory_bandwidth_gb_s",
        "bf16_tflops",
        "tdp_w",
    )


# --- names --------------------------------------------------------------------------


def test_bad_names_are_explained_in_words_not_a_regex():
    with pytest.raises(SpecError) as info:
        load_plan_spec_text("kind: plan\nname: My_Plan\nserve:\n  - name: Chat\n    model: x\n")
    found = {i.field: (i.line, i.message) for i in info.value.issues}
    assert found == {
        "name": (2, f"invalid name 'My_Plan': {NAME_WORDS}"),
        "serve.0.name": (4, f"invalid name 'Chat': {NAME_WORDS}"),
    }
    assert "pattern" not in str(info.value)


# --- divisibility and the model's limits --------------------------------------------


TRAIN = "kind: plan\nname: p\ntrain:\n  - name: t\n    model: llama-3-8b\n    tokens: 100B\n"


def test_gpus_not_a_multiple_of_tensor_parallel_names_both(tmp_path):
    found = problems(tmp_path, TRAIN + "    gpus: 12\n    tensor_parallel: 8\n")
    assert found == {
        "train.0.gpus": (
            7,
            "gpus 12 is not a multiple of tensor_parallel 8: each data-parallel replica takes "
            "8 GPUs; use gpus 8 or 16",
        )
    }
    both = problems(
        tmp_path, TRAIN + "    gpus: 12\n    tensor_parallel: 2\n    pipeline_parallel: 4\n"
    )
    assert (
        "gpus 12 is not a multiple of tensor_parallel 2 x pipeline_parallel 4 = 8"
        in (both["train.0.gpus"][1])
    )


def test_no_duration_when_no_layout_fits():
    text = TRAIN.replace("llama-3-8b", "llama-3.1-405b") + "    gpus: 8\n"
    d = plan_of(text)
    t = d["train"][0]
    assert not t["fits"]
    assert t["seconds"] is None and t["days"] is None and t["energy_usd"] is None
    assert all(p["days"] is None for p in t["time_vs_nodes"][:1])
    assert plan_report.train_rows(d)[0]["time"] == "does not fit"
    pit = [p for p in d["pitfalls"] if p["code"] == "does_not_fit"]
    assert pit and "no training time is given" in pit[0]["message"]
    assert not [p for p in d["pitfalls"] if p["code"] == "duration"]
    assert "days" not in plan_report.markdown(d, with_charts=False).split("## Training")[1][:400]


def test_context_over_the_models_max_context_names_both(tmp_path):
    text = SERVE.replace("llama-3-8b", "llama-2-7b") + "    context_length: 131072\n"
    found = problems(tmp_path, text)
    assert found["serve.0.context_length"] == (
        6,
        "context_length 131072 is over max_context 4096 of Llama 2 7B "
        "(models.llama-2-7b.max_context); serve a model with a longer context, or set "
        "models.llama-2-7b.max_context if its context was extended",
    )
    extended = text + "models:\n  llama-2-7b: {max_context: 131072}\n"
    assert resolve(load_plan_spec_text(extended), CAT).serve[0].context_length == 131072


def test_default_context_over_max_context_names_the_defaults(tmp_path):
    text = SERVE.replace("llama-3-8b", "llama-2-7b") + "    prompt_tokens: 4000\n"
    _, message = problems(tmp_path, text)["serve.0"]
    assert message.startswith(
        "the default context_length, prompt_tokens 4000 + output_tokens (default 250) = 4250, "
        "is over max_context 4096 of Llama 2 7B"
    )


QWEN = (
    "models:\n  qwen-7b: {layers: 28, hidden_size: 3584, attention_heads: 28, kv_heads: 4,"
    " vocab_size: 152064, intermediate_size: 18944}\n"
)


def test_tensor_parallel_must_split_the_heads(tmp_path):
    text = SERVE.replace("llama-3-8b", "qwen-7b") + "    tensor_parallel: 8\n" + QWEN
    assert problems(tmp_path, text)["serve.0.tensor_parallel"] == (
        6,
        "attention_heads 28 is not a multiple of tensor_parallel 8 (qwen-7b); tensor "
        "parallelism splits the heads evenly over the GPUs: use one of 1, 2, 4",
    )
    # 8 attention heads split 8 ways, but 6 KV heads neither divide nor are divided by 4
    arch = (
        "    architecture: {layers: 2, hidden_size: 768, attention_heads: 12, kv_heads: 6,"
        " vocab_size: 1000}\n    tensor_parallel: 4\n"
    )
    kv = problems(tmp_path, "kind: plan\nname: p\ntrain:\n  - name: t\n    tokens: 1B\n" + arch)
    assert kv["train.0.tensor_parallel"][1].startswith(
        "kv_heads 6 is neither a multiple nor a divisor of tensor_parallel 4"
    )


def test_automatic_tensor_parallel_respects_the_heads():
    d = plan_of(SERVE.replace("llama-3-8b", "qwen-7b") + QWEN)
    assert all(o["tensor_parallel"] in (1, 2, 4) for o in d["serve"][0]["options"])


def test_params_smaller_than_the_embeddings_is_refused(tmp_path):
    text = SERVE.replace("llama-3-8b", "tiny") + (
        "models:\n  tiny: {layers: 2, hidden_size: 4096, attention_heads: 32,"
        " vocab_size: 128256, params: 1B}\n"
    )
    assert problems(tmp_path, text)["models.tiny.params"] == (
        7,
        "params 1B is not more than the embeddings alone: vocab_size 128256 x hidden_size "
        "4096 x 2 (embedding and untied LM head) = 1.05B; check params, vocab_size and "
        "hidden_size",
    )


# --- warnings for implausible inputs -------------------------------------------------


def test_tiny_global_batch_over_many_gpus_is_warned_in_json_and_report():
    d = plan_of(TRAIN + "    gpus: 4096\n    global_batch_tokens: 1M\n")
    assert d["warnings"] == [
        {
            "field": "train.0.global_batch_tokens",
            "message": "global_batch_tokens 1M is 244 sequences of 4096 tokens per step, fewer "
            "than the 4,096 data-parallel ranks x micro_batch 1 on 4,096 GPUs: most GPUs would "
            "idle; raise global_batch_tokens to at least 16.8M or use fewer GPUs",
        }
    ]
    md = plan_report.markdown(d, with_charts=False)
    assert "## Warnings (implausible inputs)" in md and "most GPUs would idle" in md
    assert "most GPUs would idle" in plan_report.html_report(d)


def test_other_implausible_inputs_are_warned():
    d = plan_of(
        TRAIN
        + "    sequence_length: 16384\n    global_batch_tokens: 100M\n"
        + "constraints: {mfu: 0.8}\n"
    )
    fields = [w["field"] for w in d["warnings"]]
    assert fields == [
        "constraints.mfu",
        "train.0.sequence_length",
        "train.0.global_batch_tokens",
    ]
    assert "over max_context 8192 of Meta Llama 3 8B" in d["warnings"][1]["message"]
    old_name = plan_of(SERVE + "    kv_precision: fp8\n")["warnings"]
    assert old_name == [
        {
            "field": "serve.0.kv_precision",
            "message": "kv_precision is the older name of kv_cache_dtype",
        }
    ]


def test_params_far_from_the_shape_is_warned():
    text = SERVE.replace("llama-3-8b", "odd") + (
        "models:\n  odd: {layers: 32, hidden_size: 4096, attention_heads: 32,"
        " vocab_size: 32000, params: 30B}\n"
    )
    (w,) = plan_of(text)["warnings"]
    assert w["field"] == "models.odd.params" and w["message"].startswith(
        "params 30B is 3.4x the 8.85B"
    )


def test_global_batch_under_one_sequence_is_an_error(tmp_path):
    found = problems(tmp_path, TRAIN + "    global_batch_tokens: 1000\n")
    assert found["train.0.global_batch_tokens"][1] == (
        "global_batch_tokens 1000 is less than one micro-batch: sequence_length (default "
        "4096) x micro_batch (default 1) = 4096 tokens"
    )


def test_cli_prints_warnings(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(TRAIN + "    gpus: 4096\n    global_batch_tokens: 1M\n")
    res = CliRunner().invoke(app, ["plan", str(path)])
    assert res.exit_code == 0, res.output
    assert "Warnings (implausible inputs)" in res.output
    assert "train.0.global_batch_tokens" in res.output
    out = CliRunner().invoke(app, ["plan", str(path), "-o", "json"])
    assert json.loads(out.output)["warnings"][0]["field"] == "train.0.global_batch_tokens"


# --- sliding window and KV cache dtype ----------------------------------------------


def test_mistral_sliding_window_bounds_the_kv_cache():
    m = CAT.get("models", "mistral-7b")
    assert m.sliding_window == 4096
    # 2 (K, V) x 32 layers x 8 KV heads x 128 head dim x 2 bytes (fp16)
    assert kv_bytes_per_token(m, "fp16") == 2 * 32 * 8 * 128 * 2 == 131072
    assert kv_tokens(m, 32768) == 4096 and kv_tokens(m, 1000) == 1000
    assert kv_bytes_per_sequence(m, 32768, "fp16") == 131072 * 4096  # 512 MiB, not 4 GiB
    full = CAT.get("models", "llama-3-8b")  # same KV shape, full attention
    assert kv_bytes_per_sequence(full, 32768, "fp16") == 8 * kv_bytes_per_sequence(m, 32768, "fp16")


def test_sliding_window_in_a_served_plan():
    text = SERVE.replace("llama-3-8b", "mistral-7b") + (
        "    context_length: 32768\n    kv_cache_dtype: fp16\n"
    )
    s = plan_of(text)["serve"][0]
    assert s["sliding_window"] == 4096 and s["kv_cache_dtype"] == "fp16"
    assert s["kv_bytes_per_token"] == 131072
    assert s["kv_bytes_per_sequence"] == 131072 * 4096
    # without the window the same 32k sequences would need 8x the cache, so fewer fit
    inputs = resolve(load_plan_spec_text(text), CAT)
    req = inputs.serve[0]
    a = inputs.assumptions
    windowed = plan_serving(req, a).options[0]
    full = plan_serving(replace(req, model=replace(req.model, sliding_window=None)), a)
    assert windowed.kv_capacity_tokens == full.options[0].kv_capacity_tokens
    assert full.kv_bytes_per_sequence == 8 * s["kv_bytes_per_sequence"]


def test_sliding_window_in_an_architecture():
    text = (
        "kind: plan\nname: p\nserve:\n  - name: w\n    architecture: {layers: 32,"
        " hidden_size: 4096, attention_heads: 32, kv_heads: 8, vocab_size: 32000,"
        " sliding_window: 1024}\n    context_length: 8192\n"
    )
    s = plan_of(text)["serve"][0]
    assert s["kv_bytes_per_sequence"] == 2 * 32 * 8 * 128 * 2 * 1024


@pytest.mark.parametrize(
    "dtype, per_token", [("fp16", 131072), ("bf16", 131072), ("fp8", 65536), ("int8", 65536)]
)
def test_kv_cache_dtype_sets_bytes_per_token(dtype, per_token):
    s = plan_of(SERVE + f"    kv_cache_dtype: {dtype}\n")["serve"][0]
    assert s["kv_cache_dtype"] == dtype and s["kv_bytes_per_token"] == per_token


def test_kv_cache_dtype_default_and_old_name():
    assert plan_of(SERVE)["serve"][0]["kv_cache_dtype"] == "bf16"
    assert plan_of(SERVE + "    precision: fp8\n")["serve"][0]["kv_cache_dtype"] == "fp8"
    with pytest.raises(SpecError) as info:
        load_plan_spec_text(SERVE + "    kv_cache_dtype: fp8\n    kv_precision: fp8\n")
    assert info.value.issues[0].message == (
        "give kv_cache_dtype or kv_precision (its older name), not both"
    )
    with pytest.raises(SpecError):
        load_plan_spec_text(SERVE + "    kv_cache_dtype: int4\n")


# --- the JSON Schema comes from the same models --------------------------------------


def test_json_schema_of_the_plan_spec():
    schema = PlanSpec.model_json_schema()
    assert schema["additionalProperties"] is False
    assert schema["properties"]["name"]["pattern"] == "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
    defs = schema["$defs"]
    serve = defs["ServeWorkload"]["properties"]
    assert {"kv_cache_dtype", "kv_precision", "context_length"} <= set(serve)
    assert "int8" in json.dumps(serve["kv_cache_dtype"])
    assert "sliding_window" in defs["Architecture"]["properties"]
    assert "sliding_window" in defs["ModelOverride"]["properties"]
    node = json.dumps(defs["Hardware"]["properties"]["node"])
    assert '"type": "string"' in node and "#/$defs/NodeOverride" in node
    assert "#/$defs/GpuOverride" in json.dumps(defs["NodeOverride"]["properties"]["gpu"])
    for name in ("NodeOverride", "GpuOverride", "ServeWorkload", "TrainWorkload", "Hardware"):
        assert defs[name]["additionalProperties"] is False
