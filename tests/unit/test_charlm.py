"""The char-level language model (`runtime.charlm`) and the example that trains it
(`examples/char-lm/train.py`, run as a user would, with a test-size setting)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the char LM needs torch (the 'torch' extra)")

from aicluster.runtime.charlm import (  # noqa: E402
    CharLM,
    CharLMConfig,
    CharTokenizer,
    StopFilter,
    generate,
    load_model,
    save_model,
)

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "char-lm" / "train.py"
STEP_RE = re.compile(r"^step (\d+) loss ([0-9.]+)$", re.MULTILINE)


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Tiny models run far slower with several threads on a busy machine; restore after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_model(seed: int = 0) -> CharLM:
    torch.manual_seed(seed)
    vocab = CharTokenizer.from_text("the quick brown fox jumps over a lazy dog.\n").vocab
    return CharLM(CharLMConfig(vocab=vocab, n_embd=16, n_head=2, n_layer=1, block_size=16)).eval()


def test_tokenizer_round_trips_known_text_and_maps_unknown_to_space():
    tok = CharTokenizer.from_text("hello world")
    assert tok.decode(tok.encode("hello world")) == "hello world"
    assert tok.decode(tok.encode("hex!")) == "he  "  # 'x' and '!' are not in the vocabulary


def test_config_round_trips_and_rejects_bad_shapes():
    cfg = CharLMConfig(vocab="ab\n", n_embd=8, n_head=2, n_layer=1, block_size=4)
    assert CharLMConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ValueError, match="multiple of n_head"):
        CharLMConfig(vocab="ab", n_embd=10, n_head=4)
    with pytest.raises(ValueError, match="distinct"):
        CharLMConfig(vocab="aa")
    with pytest.raises(ValueError, match="not an"):
        CharLMConfig.from_json('{"vocab": "ab"}')


def test_saved_model_loads_with_identical_outputs(tmp_path):
    model = tiny_model()
    save_model(model, tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.pt"]
    loaded = load_model(tmp_path / "m")
    x = torch.tensor([model.tokenizer.encode("the fox")])
    assert torch.equal(model(x)[0], loaded(x)[0])
    with pytest.raises(FileNotFoundError, match="not a char-lm model folder"):
        load_model(tmp_path)


def test_generate_is_seeded_streams_one_char_at_a_time_and_slides_its_window():
    model = tiny_model()
    long_prompt = "the lazy dog " * 5  # longer than block_size (16): read through a window
    a = list(generate(model, long_prompt, 40, temperature=1.0, seed=7))
    assert len(a) == 40 and all(len(ch) == 1 and ch in model.config.vocab for ch in a)
    assert a == list(generate(model, long_prompt, 40, temperature=1.0, seed=7))
    assert a != list(generate(model, long_prompt, 40, temperature=1.0, seed=8))
    greedy = list(generate(model, "", 10, temperature=0, seed=1))
    assert greedy == list(generate(model, "", 10, temperature=0, seed=2))


def test_stop_filter_holds_back_a_possible_stop_and_cuts_at_it():
    f = StopFilter(["END"])
    assert [f.feed(c) for c in "abE"] == ["a", "b", ""]
    assert f.feed("x") == "Ex" and not f.stopped  # 'Ex' cannot start 'END': released
    assert [f.feed(c) for c in "yEN"] == ["y", "", ""]
    assert f.feed("D") == "" and f.stopped
    g = StopFilter(["\n\n", "zz"])
    assert g.feed("ab\n") == "ab" and g.feed("q") == "\nq" and g.feed("z") == ""
    assert g.flush() == "z"


def test_train_script_lowers_the_loss_and_saves_to_the_platform_checkpoint_dir(tmp_path):
    out = tmp_path / "ckpt"  # a job's AICLUSTER_CHECKPOINT_DIR is the default --out
    env = dict(os.environ, AICLUSTER_CHECKPOINT_DIR=str(out))
    env.pop("RANK", None)
    args = [
        "--steps",
        "60",
        "--log-every",
        "10",
        "--n-embd",
        "32",
        "--batch-size",
        "16",
        "--block-size",
        "32",
        "--sample-chars",
        "20",
    ]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    losses = [float(m[1]) for m in STEP_RE.findall(proc.stdout)]
    assert len(losses) == 7  # step 1 and every 10th up to 60
    assert losses[-1] < losses[0] * 0.8, proc.stdout
    assert f"saved model to {out.resolve()}" in proc.stdout
    assert not (tmp_path / "model").exists()
    assert re.search(r"^eval loss [0-9.]+$", proc.stdout, re.MULTILINE)
    model = load_model(out)
    assert model.config.n_embd == 32 and model.config.block_size == 32
    assert len(list(generate(model, "The ", 5, 0.8, 0))) == 5
