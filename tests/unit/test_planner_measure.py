"""Our own measurement: the memory a small Llama-shaped torch model really takes on this
machine against the planner's estimate (parameters x bytes)."""

from __future__ import annotations

import gc
import io

import psutil
import pytest

from aicluster.planner.hardware import ModelShape
from aicluster.planner.memory import kv_bytes_per_token, param_counts, weight_bytes

torch = pytest.importorskip("torch")
nn = torch.nn

SHAPE = ModelShape(
    key="tiny-llama",
    name="tiny Llama-shaped model",
    layers=4,
    hidden_size=1024,
    attention_heads=16,
    kv_heads=4,
    intermediate_size=2816,
    vocab_size=32000,
)


class Block(nn.Module):
    """The weights of one Llama decoder layer (GQA attention, SwiGLU MLP, two RMSNorms)."""

    def __init__(self, m: ModelShape):
        super().__init__()
        h, d = m.hidden_size, m.d_head
        self.q = nn.Linear(h, m.attention_heads * d, bias=False)
        self.k = nn.Linear(h, m.n_kv_heads * d, bias=False)
        self.v = nn.Linear(h, m.n_kv_heads * d, bias=False)
        self.o = nn.Linear(m.attention_heads * d, h, bias=False)
        self.gate = nn.Linear(h, m.d_ff, bias=False)
        self.up = nn.Linear(h, m.d_ff, bias=False)
        self.down = nn.Linear(m.d_ff, h, bias=False)
        self.norm1 = nn.Parameter(torch.ones(h))
        self.norm2 = nn.Parameter(torch.ones(h))


class TinyLlama(nn.Module):
    def __init__(self, m: ModelShape):
        super().__init__()
        self.embed = nn.Embedding(m.vocab_size, m.hidden_size)
        self.blocks = nn.ModuleList(Block(m) for _ in range(m.layers))
        self.norm = nn.Parameter(torch.ones(m.hidden_size))
        self.lm_head = nn.Linear(m.hidden_size, m.vocab_size, bias=False)


def _rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def test_parameter_count_of_a_real_module_matches():
    model = TinyLlama(SHAPE)
    assert sum(p.numel() for p in model.parameters()) == param_counts(SHAPE).total


def _grown_by_a_model() -> int:
    """RSS growth of building the model (fp32; initialisation writes every page)."""
    torch.manual_seed(0)
    before = _rss()
    model = TinyLlama(SHAPE)
    grown = _rss() - before
    del model
    return grown


def test_measured_weight_memory_matches_estimate():
    import multiprocessing

    # A fresh process: in one that ran other tests, the allocator reuses freed pages and
    # the growth says little.
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        grown = pool.apply(_grown_by_a_model)
    estimate = weight_bytes(SHAPE, "fp32")
    assert estimate > 250e6  # big enough that allocator noise is small
    assert grown == pytest.approx(estimate, rel=0.10)
    model = TinyLlama(SHAPE)
    # bf16: exactly 2 bytes per parameter in tensor storage and in a saved state dict
    model = model.to(torch.bfloat16)
    stored = sum(p.untyped_storage().nbytes() for p in model.parameters())
    assert stored == weight_bytes(SHAPE, "bf16")
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    assert buf.tell() == pytest.approx(weight_bytes(SHAPE, "bf16"), rel=0.01)


def test_measured_kv_cache_matches_estimate():
    tokens = 512
    k = torch.empty(SHAPE.layers, tokens, SHAPE.n_kv_heads, SHAPE.d_head, dtype=torch.bfloat16)
    v = torch.empty_like(k)
    measured = k.untyped_storage().nbytes() + v.untyped_storage().nbytes()
    assert measured == kv_bytes_per_token(SHAPE, "bf16") * tokens


def test_measured_adam_state_matches_estimate():
    # fp32 Adam keeps two fp32 moments per parameter (8 bytes), as the mixed-precision rule's
    # K = 12 counts them with the fp32 master copy (ZeRO Sec. 3.1).
    small = ModelShape(
        key="s", name="s", layers=2, hidden_size=256, attention_heads=4, vocab_size=1000
    )
    model = TinyLlama(small)
    opt = torch.optim.Adam(model.parameters())
    x = torch.randint(0, small.vocab_size, (2, 8))
    loss = model.lm_head(model.embed(x)).float().logsumexp(-1).mean()
    loss.backward()
    opt.step()
    state = sum(
        t.untyped_storage().nbytes() for s in opt.state.values() for t in s.values() if t.dim()
    )
    used = [p for p in model.parameters() if p.grad is not None]
    assert state == 8 * sum(p.numel() for p in used)
