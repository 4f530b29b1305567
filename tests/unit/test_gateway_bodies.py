"""gateway.bodies: one parse that agrees with json.loads, and a `model` respelled by
changing only its own bytes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aicluster.gateway.bodies import BodyError, parse

scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=200, deadline=None)
@given(doc=st.dictionaries(st.text(max_size=6), values, max_size=5), model=st.text(max_size=10))
def test_parse_agrees_with_json_loads_and_only_the_model_changes(doc, model):
    doc = {**doc, "model": model}
    for raw in (json.dumps(doc).encode(), json.dumps(doc, indent=1, ensure_ascii=False).encode()):
        body = parse(raw)
        assert body.doc == json.loads(raw) and body.model == model
        out = json.loads(body.with_model("served"))
        assert out == {**doc, "model": "served"}
        assert body.with_model(model) is raw  # already the served name: the same bytes


def test_only_the_top_level_model_is_respelled_and_the_rest_keeps_its_bytes():
    raw = b'{"messages": [{"model": "x"}], "model" : "team/chat", "n": 1.50, "t": "\\u00e9"}'
    assert parse(raw).with_model("chat") == (
        b'{"messages": [{"model": "x"}], "model" : "chat", "n": 1.50, "t": "\\u00e9"}'
    )
    dup = parse(b'{"model": "a", "model": "b"}')  # the last wins, as in json.loads
    assert dup.model == "b" and json.loads(dup.with_model("c")) == {"model": "c"}


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"[1]", "JSON object"),
        (b'"x"', "JSON object"),
        (b"{", "not valid JSON"),
        (b'{"a": 1,}', "not valid JSON"),
        (b'{"a": 1} 2', "not valid JSON"),
        (b"\xff\xfe\xff", "not valid JSON"),
        (b"", "not valid JSON"),
        (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "too deeply"),
    ],
)
def test_what_is_not_a_json_object_is_a_body_error(raw, words):
    with pytest.raises(BodyError) as exc:
        parse(raw)
    assert words in str(exc.value)
