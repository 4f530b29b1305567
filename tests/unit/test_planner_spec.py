"""`kind: plan` specs: good ones load, bad ones name the field (and line)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aicluster.cli.plan_cmds import load_plan
from aicluster.planner.catalog import load_catalog
from aicluster.planner.inputs import PlanInputError, resolve
from aicluster.planner.spec import (
    PlanSpec,
    load_plan_spec,
    load_plan_spec_text,
    parse_count,
)
from aicluster.specs import SpecError

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("plan-*.yaml"))

MINIMAL = """\
kind: plan
name: p
serve:
  - name: chat
    model: llama-3-8b
"""


def issues(text: str):
    with pytest.raises(SpecError) as info:
        load_plan_spec_text(text)
    return info.value.issues


def test_examples_load_and_resolve():
    assert len(EXAMPLES) >= 3
    for path in EXAMPLES:
        spec = load_plan_spec(path)
        assert isinstance(spec, PlanSpec)
        resolve(spec, load_catalog())


def test_minimal_plan_gets_defaults():
    spec = load_plan_spec_text(MINIMAL)
    assert isinstance(spec, PlanSpec)
    assert spec.hardware.node == "dgx-h100" and spec.serve[0].precision == "bf16"


@pytest.mark.parametrize(
    "text, value",
    [("2T", 2e12), ("300B", 3e11), ("1.5e12", 1.5e12), (5e8, 5e8), ("50m", 5e7)],
)
def test_counts(text, value):
    assert parse_count(text) == value


@pytest.mark.parametrize(
    "extra, field, line",
    [
        ("    precision: int3\n", "serve.0.precision", 6),
        ("    tensor_parallel: 0\n", "serve.0.tensor_parallel", 6),
        ("    gpus_per_replica: 2\n", "serve.0.gpus_per_replica", 6),
        ("    requests_per_second: -1\n", "serve.0.requests_per_second", 6),
    ],
)
def test_bad_serve_fields_are_named(extra, field, line):
    found = issues(MINIMAL + extra)
    assert [(i.field, i.line) for i in found] == [(field, line)]


def test_bad_train_and_constraint_fields_are_named():
    text = """\
kind: plan
name: p
train:
  - name: t
    model: llama-2-7b
    tokens: lots
    method: dora
constraints:
  mfu: 1.5
"""
    fields = {i.field: i.line for i in issues(text)}
    assert fields == {"train.0.tokens": 6, "train.0.method": 7, "constraints.mfu": 9}


def test_workload_level_rules():
    assert issues("kind: plan\nname: p\n")[0].message.startswith(
        "a plan needs at least one workload"
    )
    both = issues(
        MINIMAL.replace(
            "model: llama-3-8b",
            "model: x\n    architecture: {layers: 1, hidden_size: 8, attention_heads: 2, vocab_size: 10}",
        )
    )
    assert both[0].field == "serve.0" and "exactly one of model" in both[0].message
    rate = issues(MINIMAL + "    requests_per_second: 1\n    concurrent_users: 5\n")
    assert rate[0].field == "serve.0" and "not both" in rate[0].message


def test_unknown_catalog_names_are_named_with_their_line(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(
        MINIMAL.replace("llama-3-8b", "llama-9b") + "hardware:\n  network: carrier-pigeon\n"
    )
    with pytest.raises(SpecError) as info:
        load_plan(path)
    found = {i.field: i for i in info.value.issues}
    assert found["serve.0.model"].line == 5
    assert "unknown model 'llama-9b'" in found["serve.0.model"].message
    assert found["hardware.network"].line == 7


def test_incomplete_new_model_names_every_missing_field_at_once(tmp_path):
    text = MINIMAL.replace("llama-3-8b", "mine") + "models:\n  mine:\n    layers: 4\n"
    with pytest.raises(PlanInputError) as info:
        resolve(load_plan_spec_text(text), load_catalog())
    assert info.value.issues == [
        (
            "models.mine",
            "incomplete model: missing models.mine.hidden_size, models.mine.attention_heads, "
            "models.mine.vocab_size (a new model needs layers, hidden_size, attention_heads, "
            "vocab_size)",
        )
    ]


def test_overrides_and_explicit_architecture():
    text = """\
kind: plan
name: p
hardware:
  gpus:
    h100-sxm: {price_usd: 1}
serve:
  - name: tiny
    architecture: {layers: 2, hidden_size: 256, attention_heads: 4, kv_heads: 2, vocab_size: 1000}
"""
    inputs = resolve(load_plan_spec_text(text), load_catalog())
    assert inputs.serve[0].gpu.price_usd == 1
    assert inputs.serve[0].gpu.sources["override"]
    assert inputs.serve[0].model.n_kv_heads == 2
