"""A tiny character-level causal transformer language model (the `builtin` engine's LM).

Vocabulary:
- token: one character. The vocabulary is the sorted set of characters of the training
  text, stored in the model folder; a character outside it encodes as the fallback token
  (a space when the vocabulary has one, else token 0). `usage` counts are characters.
- context window: `block_size` characters. Longer prompts are read through their last
  `block_size` characters (a sliding window), so no prompt is too long.
- model folder: `config.json` (`CharLMConfig` as JSON, `format: aicluster-charlm`) and
  `model.pt` (the state dict). `save_model` writes each file atomically, weights first,
  so a folder whose `config.json` exists has complete weights beside it.

Invariants:
- `generate` is deterministic for a given (model, prompt, max_tokens, temperature, seed):
  it draws only from its own `torch.Generator`, so concurrent calls do not disturb each
  other. Temperature 0 is greedy decoding.
- `generate` yields exactly one character per step and at most `max_tokens` of them.
- `StopFilter` never lets a stop string, or a part of one, out.
- Importing this module imports torch; nothing else happens at import time.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

FORMAT = "aicluster-charlm"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.pt"


@dataclass(frozen=True)
class CharLMConfig:
    """The model's shape and its vocabulary (every character it knows, in token order)."""

    vocab: str
    n_embd: int = 64
    n_head: int = 4
    n_layer: int = 2
    block_size: int = 64
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if len(set(self.vocab)) != len(self.vocab) or not self.vocab:
            raise ValueError("vocab must be a non-empty string of distinct characters")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")
        if min(self.n_embd, self.n_head, self.n_layer, self.block_size) < 1:
            raise ValueError("n_embd, n_head, n_layer and block_size must be positive")

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, **asdict(self)}, indent=2, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> CharLMConfig:
        data = json.loads(text)
        if data.pop("format", None) != FORMAT:
            raise ValueError(f"not an {FORMAT} config")
        return cls(**data)


class CharTokenizer:
    """Characters <-> token ids over a fixed vocabulary."""

    def __init__(self, vocab: str) -> None:
        self.vocab = vocab
        self._ids = {ch: i for i, ch in enumerate(vocab)}
        self.fallback = self._ids.get(" ", 0)

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls("".join(sorted(set(text))))

    def __len__(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        return [self._ids.get(ch, self.fallback) for ch in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.vocab[i] for i in ids)


class _Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then a 4x MLP, each residual."""

    def __init__(self, cfg: CharLMConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd),
            nn.GELU(),
            nn.Linear(4 * cfg.n_embd, cfg.n_embd),
        )
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        heads = [z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v)]
        p = self.drop.p if self.training else 0.0
        att = F.scaled_dot_product_attention(*heads, is_causal=True, dropout_p=p)
        x = x + self.drop(self.proj(att.transpose(1, 2).reshape(b, t, c)))
        return x + self.drop(self.mlp(self.ln2(x)))


class CharLM(nn.Module):
    """Token + position embeddings, `n_layer` blocks, a head tied to the token embedding."""

    def __init__(self, cfg: CharLMConfig) -> None:
        super().__init__()
        self.config = cfg
        self.tokenizer = CharTokenizer(cfg.vocab)
        self.tok = nn.Embedding(len(cfg.vocab), cfg.n_embd)
        self.pos = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layer))
        self.ln = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, len(cfg.vocab), bias=False)
        self.head.weight = self.tok.weight
        self.apply(self._init)
        for name, p in self.named_parameters():  # scaled residual projections (GPT-2 style)
            if name.endswith(("proj.weight", "mlp.2.weight")):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """Logits (B, T, vocab) for ids (B, T), T <= block_size; and the mean cross-entropy
        against `targets` when given (else None)."""
        t = idx.shape[1]
        if t > self.config.block_size:
            raise ValueError(f"sequence of {t} exceeds block_size {self.config.block_size}")
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss


def _atomic_write(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_model(model: CharLM, folder: str | os.PathLike) -> Path:
    """Write `model.pt` then `config.json` into `folder` (created if needed)."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    _atomic_write(out / WEIGHTS_FILE, lambda p: torch.save(state, p))
    _atomic_write(out / CONFIG_FILE, lambda p: Path(p).write_text(model.config.to_json()))
    return out


def is_model_folder(folder: str | os.PathLike) -> bool:
    return (Path(folder) / CONFIG_FILE).is_file() and (Path(folder) / WEIGHTS_FILE).is_file()


def load_model(folder: str | os.PathLike, device: str | torch.device = "cpu") -> CharLM:
    """The model saved in `folder`, in eval mode on `device`."""
    path = Path(folder)
    if not is_model_folder(path):
        need = f"{CONFIG_FILE} + {WEIGHTS_FILE}"
        raise FileNotFoundError(f"{path} is not a char-lm model folder ({need})")
    model = CharLM(CharLMConfig.from_json((path / CONFIG_FILE).read_text()))
    state = torch.load(path / WEIGHTS_FILE, map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model.to(device).eval()


def generate(
    model: CharLM,
    prompt: str,
    max_tokens: int,
    temperature: float = 1.0,
    seed: int | None = None,
) -> Iterator[str]:
    """Continue `prompt`, one character per `next()`, at most `max_tokens` characters.
    `seed=None` draws a fresh seed. Closing the iterator stops the work."""
    if temperature < 0:
        raise ValueError("temperature must be >= 0")
    device = next(model.parameters()).device
    gen = torch.Generator(device=device)
    gen.manual_seed(secrets.randbits(63) if seed is None else seed)
    window = model.config.block_size
    ids = model.tokenizer.encode(prompt)[-window:] or [model.tokenizer.fallback]
    ctx = torch.tensor([ids], dtype=torch.long, device=device)
    for _ in range(max_tokens):
        with torch.inference_mode():
            logits = model(ctx[:, -window:])[0][0, -1]
            if temperature == 0:
                nxt = int(torch.argmax(logits))
            else:
                probs = torch.softmax(logits.float() / temperature, dim=-1)
                nxt = int(torch.multinomial(probs, 1, generator=gen))
        ctx = torch.cat([ctx, torch.tensor([[nxt]], device=device)], dim=1)[:, -window:]
        yield model.tokenizer.vocab[nxt]


class StopFilter:
    """Cuts streamed text at the first of `stops`, holding back any tail that could be the
    start of one. `feed` returns what is safe to emit; `stopped` turns true at a stop."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops, self.pending, self.stopped = tuple(stops), "", False

    def feed(self, piece: str) -> str:
        self.pending += piece
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.pending, self.stopped = self.pending[: min(hits)], "", True
            return out
        keep = len(self.pending)
        for k in range(len(self.pending)):
            if any(s.startswith(self.pending[k:]) for s in self.stops):
                keep = k
                break
        out, self.pending = self.pending[:keep], self.pending[keep:]
        return out

    def flush(self) -> str:
        """The held-back tail, once generation ends without a stop."""
        out, self.pending = self.pending, ""
        return out
