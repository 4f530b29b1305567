#!/usr/bin/env python3
"""Train the tiny character-level language model that aicluster's `builtin` engine serves.

Runs as a 1-worker aicluster job or on its own (`python train.py`). It reads a small
text corpus (`corpus.txt`, beside this script, by default), trains
`aicluster.runtime.charlm.CharLM` on random windows of it, and saves the model folder
(`model.pt` + `config.json`) to `--out`: default `$AICLUSTER_CHECKPOINT_DIR` (if the job
sets it in its `env`), else `./model`. Only rank 0 writes, so a larger gang is harmless.

Lines meant for programs (each flushed as it is written):

    step S loss L                     (every --log-every steps and at the last step)
    eval loss L                       (held-out last 10% of the corpus, at the end)
    saved model to PATH
    train seconds T
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch

try:
    from aicluster.runtime.charlm import CharLM, CharLMConfig, CharTokenizer, generate, save_model
except ImportError as exc:  # the platform's package is needed for the model class
    print(f"train.py: error: {exc}; install aicluster with its torch extra", file=sys.stderr)
    sys.exit(2)

HERE = Path(__file__).resolve().parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", default=str(HERE / "corpus.txt"), help="UTF-8 text file")
    p.add_argument(
        "--out",
        default=os.environ.get("AICLUSTER_CHECKPOINT_DIR") or "./model",
        help="model folder (default $AICLUSTER_CHECKPOINT_DIR, else ./model)",
    )
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--n-embd", type=int, default=64)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: no oversubscription on a shared node; 0: torch's own)",
    )
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--sample-chars", type=int, default=240, help="sample printed at the end")
    args = p.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1 or args.log_every < 1:
        p.error("--steps, --batch-size and --log-every must be positive")
    return args


def batches(data: torch.Tensor, block: int, size: int, gen: torch.Generator):
    """Endless (inputs, targets) pairs: random windows, targets shifted by one."""
    top = len(data) - block - 1
    while True:
        starts = torch.randint(0, top, (size,), generator=gen)
        x = torch.stack([data[s : s + block] for s in starts.tolist()])
        y = torch.stack([data[s + 1 : s + 1 + block] for s in starts.tolist()])
        yield x, y


def lr_at(step: int, steps: int, peak: float) -> float:
    """Linear warm-up over the first 5% of steps, then cosine decay to 10% of the peak."""
    warm = max(1, steps // 20)
    if step < warm:
        return peak * (step + 1) / warm
    t = (step - warm) / max(1, steps - warm)
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * t)))


@torch.no_grad()
def eval_loss(model: CharLM, data: torch.Tensor, block: int) -> float:
    model.eval()
    n = (len(data) - 1) // block
    if n < 1:
        return float("nan")
    x = data[: n * block].view(n, block)
    y = data[1 : n * block + 1].view(n, block)
    loss = float(model(x, y)[1])
    model.train()
    return loss


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    text = Path(args.corpus).read_text(encoding="utf-8")
    tok = CharTokenizer.from_text(text)
    data = torch.tensor(tok.encode(text), dtype=torch.long)
    split = int(len(data) * 0.9)
    train, held = data[:split], data[split:]
    if len(train) <= args.block_size + 1:
        print(
            f"train.py: error: corpus too small for --block-size {args.block_size}", file=sys.stderr
        )
        return 2
    cfg = CharLMConfig(
        vocab=tok.vocab,
        n_embd=args.n_embd,
        n_head=args.n_head,
        n_layer=args.n_layer,
        block_size=args.block_size,
    )
    model = CharLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed)
    params = sum(p.numel() for p in model.parameters())
    print(f"corpus {len(text)} chars, vocab {len(tok)}, params {params}", flush=True)
    t0 = time.perf_counter()
    stream = batches(train, args.block_size, args.batch_size, gen)
    for step in range(1, args.steps + 1):
        for group in opt.param_groups:
            group["lr"] = lr_at(step - 1, args.steps, args.lr)
        x, y = next(stream)
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.log_every == 0 or step == 1 or step == args.steps:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    elapsed = time.perf_counter() - t0
    print(f"eval loss {eval_loss(model, held, args.block_size):.4f}", flush=True)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"saved model to {save_model(model.eval(), args.out).resolve()}", flush=True)
    print(f"train seconds {elapsed:.1f}", flush=True)
    if args.sample_chars:
        sample = "".join(generate(model.eval(), "The ", args.sample_chars, 0.8, args.seed))
        print(f"sample:\nThe {sample}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
