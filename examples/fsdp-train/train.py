#!/usr/bin/env python3
"""Small, reproducible FSDP training example with sharded, resharding checkpoints.

The aicluster platform starts this script once per worker with a torchrun-compatible
environment (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK, NODE_RANK,
CUDA_VISIBLE_DEVICES). Without WORLD_SIZE it runs as a single process (no FSDP, the
same checkpoint format), so ``python train.py`` works on its own.

It trains a tiny decoder-only transformer (FSDP2: ``fully_shard`` per block and at the
root) on token sequences drawn from a Markov chain made from ``--seed``. Checkpoints are
``torch.distributed.checkpoint`` (DCP) folders: every rank writes only its own shards,
rank 0 adds ``.metadata``; DCP reshards on load, so a checkpoint written by 2 ranks
resumes on 3 (or 1).

Invariants:
- The *global* batch of step S depends only on (seed, S): ``--global-batch`` samples,
  rank R of W takes the R-th of W equal slices. Gradients are averaged over ranks (equal
  slices, so the result is the global-batch mean), the logged loss is the global mean.
  Any world size that divides ``--global-batch`` therefore follows the same loss curve,
  up to float summation order (README: tolerance).
- Inside an aicluster job (AICLUSTER_TOKEN set) each rank pushes its own shard files and
  ``aicluster.runtime.checkpoint.save_shards`` commits them as one version of
  TEAM/JOBNAME-ckpt only when every rank's files are in; a resume pulls the newest
  version on each node (``checkpoint.latest``). Outside a job the step folders under
  ``--checkpoint-dir`` are the checkpoints (a folder with ``.metadata`` is complete).

Lines meant for programs (each flushed as it is written, rank 0 unless said):

    resumed from step S
    step S loss L                                   (every --log-every steps)
    checkpoint saved step S path P
    final step S rank R params_sha256 HEX           (once, every rank)
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import math
import os
import re
import shutil
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

NUM_SEQS = 2048
SEQ_LEN = 16
VOCAB = 32
D_MODEL = 32
HEADS = 2
LAYERS = 2
FF = 64
KEEP_LOCAL = 2  # local step folders kept per rank
PG_TIMEOUT = datetime.timedelta(seconds=120)
STEP_DIR_RE = re.compile(r"^step-(\d{8})$")


def say(msg: str) -> None:
    print(msg, flush=True)


def fail(msg: str, code: int = 2) -> None:
    print(f"train.py: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


# --------------------------------------------------------------------------- args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="FSDP training example with sharded checkpoints for aicluster."
    )
    p.add_argument("--steps", type=int, default=60, help="total optimizer steps (default 60)")
    p.add_argument(
        "--global-batch",
        type=int,
        default=24,
        help="sequences per step over all workers; must divide by the worker count (default 24)",
    )
    p.add_argument("--lr", type=float, default=0.01, help="AdamW learning rate (default 0.01)")
    p.add_argument(
        "--checkpoint-every", type=int, default=10, help="checkpoint every N steps (default 10)"
    )
    p.add_argument(
        "--checkpoint-dir",
        default=os.environ.get("AICLUSTER_CHECKPOINT_DIR") or "./checkpoints",
        help="local checkpoint folder (default $AICLUSTER_CHECKPOINT_DIR, else ./checkpoints)",
    )
    p.add_argument("--log-every", type=int, default=1, help="log the loss every N steps")
    p.add_argument("--seed", type=int, default=1234, help="seed for data and model init")
    args = p.parse_args(argv)
    for name in ("steps", "global_batch", "checkpoint_every", "log_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not (math.isfinite(args.lr) and args.lr > 0):
        p.error(f"--lr must be a finite number > 0, got {args.lr}")
    if args.seed < 0:
        p.error(f"--seed must be >= 0, got {args.seed}")
    if not str(args.checkpoint_dir).strip():
        p.error("--checkpoint-dir must not be empty")
    return args


def env_int(name: str, default: int | None = None) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        if default is None:
            fail(f"environment variable {name} is required when WORLD_SIZE is set")
        return default
    try:
        return int(raw)
    except ValueError:
        fail(f"environment variable {name} must be an integer, got {raw!r}")
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------- setup


class Dist:
    """Where this worker sits in the job; collectives that are no-ops alone."""

    def __init__(self) -> None:
        self.distributed = bool(os.environ.get("WORLD_SIZE", "").strip())
        if self.distributed:
            self.world_size, self.rank = env_int("WORLD_SIZE"), env_int("RANK")
            self.local_rank = env_int("LOCAL_RANK", 0)
            if self.world_size < 1:
                fail(f"WORLD_SIZE must be >= 1, got {self.world_size}")
            if not 0 <= self.rank < self.world_size:
                fail(f"RANK must be in [0, {self.world_size}), got {self.rank}")
            for name in ("MASTER_ADDR", "MASTER_PORT"):
                if not os.environ.get(name, "").strip():
                    fail(f"environment variable {name} is required when WORLD_SIZE is set")
            env_int("MASTER_PORT")
        else:
            self.world_size, self.rank, self.local_rank = 1, 0, 0

        if torch.cuda.is_available():
            count = torch.cuda.device_count()
            index = 0 if count == 1 else self.local_rank % count
            torch.cuda.set_device(index)
            self.device, self.backend = torch.device("cuda", index), "nccl"
        else:
            torch.set_num_threads(1)  # also makes CPU float sums run in one fixed order
            self.device, self.backend = torch.device("cpu"), "gloo"
            master = os.environ.get("MASTER_ADDR", "").strip()
            if self.distributed and master in ("127.0.0.1", "localhost"):
                os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        if self.distributed:
            dist.init_process_group(
                backend=self.backend,
                init_method="env://",
                world_size=self.world_size,
                rank=self.rank,
                timeout=PG_TIMEOUT,
            )

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_gather(self, obj) -> list:
        """Every rank's `obj`, in rank order (picklable objects)."""
        if not self.distributed:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def mean(self, t: torch.Tensor) -> float:
        t = t.detach().clone()
        if self.distributed:
            dist.all_reduce(t)
            t /= self.world_size
        return float(t.item())

    def close(self) -> None:
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()


# --------------------------------------------------------------------------- data / model


def make_dataset(seed: int) -> torch.Tensor:
    """NUM_SEQS sequences of SEQ_LEN + 1 tokens from a random, peaked Markov chain."""
    gen = torch.Generator().manual_seed(seed)
    trans = torch.softmax(3.0 * torch.randn(VOCAB, VOCAB, generator=gen), dim=1)
    tokens = torch.empty(NUM_SEQS, SEQ_LEN + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, VOCAB, (NUM_SEQS,), generator=gen)
    for t in range(SEQ_LEN):
        tokens[:, t + 1] = torch.multinomial(trans[tokens[:, t]], 1, generator=gen).squeeze(1)
    return tokens


def global_batch_indices(seed: int, step: int, size: int) -> torch.Tensor:
    """The sequences of step `step` (0-based), the same on every rank and world size."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(0, NUM_SEQS, (size,), generator=gen)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.proj = nn.Linear(D_MODEL, D_MODEL)
        self.ff1, self.ff2 = nn.Linear(D_MODEL, FF), nn.Linear(FF, D_MODEL)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, D_MODEL // HEADS).unbind(2)
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, D_MODEL))
        return x + self.ff2(F.gelu(self.ff1(self.ln2(x))))


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Embedding(SEQ_LEN, D_MODEL)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def params_sha256(model: nn.Module) -> str:
    """Hash of the full parameters (FSDP shards are gathered; a collective)."""
    h = hashlib.sha256()
    for _, p in sorted(model.named_parameters()):
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


# --------------------------------------------------------------------------- checkpoints


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step-{step:08d}")


def local_steps(root: str) -> list[int]:
    """Steps of complete local checkpoints (DCP writes .metadata last)."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    return sorted(
        int(m.group(1))
        for n in names
        if (m := STEP_DIR_RE.match(n)) and os.path.exists(os.path.join(root, n, ".metadata"))
    )


def artifact_checkpoints():
    """aicluster's checkpoint store when this runs as an aicluster job, else None."""
    if not os.environ.get("AICLUSTER_TOKEN"):
        return None
    try:
        from aicluster.runtime import checkpoint
    except ImportError:
        return None
    return checkpoint


def state_of(model, optimizer, step: int, args, env: Dist) -> dict:
    msd, osd = get_state_dict(model, optimizer)
    meta = {"step": step, "seed": args.seed, "global_batch": args.global_batch}
    return {"model": msd, "optim": osd, "meta": {**meta, "world_size": env.world_size}}


def save(root: str, step: int, model, optimizer, args, env: Dist, store) -> str:
    """Write this rank's shards of `step`; in a job, push them as one version."""
    folder = step_dir(root, step)
    shutil.rmtree(folder, ignore_errors=True)  # a leftover of an earlier run of this step
    env.all_gather(None)  # nobody writes before every rank has cleared its folder
    dcp.save(state_of(model, optimizer, step, args, env), checkpoint_id=folder)
    path = folder
    if store is not None:
        path = store.save_shards(
            folder,
            step=step,
            rank=env.rank,
            all_gather=env.all_gather,
            metadata={"world_size": env.world_size},
        )
    for old in local_steps(root)[:-KEEP_LOCAL]:
        shutil.rmtree(step_dir(root, old), ignore_errors=True)
    return path


def resume(root: str, model, optimizer, args, env: Dist, store) -> int:
    """Load the newest checkpoint (any world size); returns its step, 0 when none."""
    if store is not None:
        try:  # every rank materialises the newest version on its own node
            found, error = store.latest(), None
        except Exception as exc:  # noqa: BLE001 - the other ranks must hear of it
            found, error = None, f"{type(exc).__name__}: {exc}"
        errors = [f"rank {r}: {e}" for r, e in enumerate(env.all_gather(error)) if e]
        if errors:
            fail("cannot fetch the newest checkpoint: " + "; ".join(errors), code=1)
        folder = str(found) if found is not None else None
    else:  # rank 0 picks; every rank must see that folder (one machine, or shared)
        steps = env.all_gather(local_steps(root)[-1] if local_steps(root) else 0)[0]
        folder = step_dir(root, steps) if steps else None
        if folder is not None and not os.path.exists(os.path.join(folder, ".metadata")):
            folder = None
    have = env.all_gather(folder is not None)
    if not all(have):
        if any(have):
            lacking = [r for r, ok in enumerate(have) if not ok]
            fail(f"ranks {lacking} see no checkpoint (is --checkpoint-dir shared?)", code=1)
        return 0
    state = state_of(model, optimizer, 0, args, env)
    dcp.load(state, checkpoint_id=folder)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    meta = state["meta"]
    if len(set(env.all_gather(meta["step"]))) != 1:
        fail("ranks loaded checkpoints of different steps", code=1)
    for key in ("seed", "global_batch"):
        if meta[key] != getattr(args, key):
            print(
                f"warning: checkpoint was made with --{key.replace('_', '-')} {meta[key]}, "
                f"now {getattr(args, key)}; the loss curve will differ",
                file=sys.stderr,
                flush=True,
            )
    if env.is_main and meta["world_size"] != env.world_size:
        say(f"resharding from {meta['world_size']} to {env.world_size} workers")
    return int(meta["step"])


# --------------------------------------------------------------------------- main


def build(env: Dist, args) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(args.seed)  # the same full init on every rank, then sharded
    model = TinyLM().to(env.device)
    if env.distributed:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = os.path.abspath(os.path.expanduser(args.checkpoint_dir))
    env = Dist()
    try:
        return train(args, env, root)
    finally:
        env.close()


def train(args: argparse.Namespace, env: Dist, root: str) -> int:
    if args.global_batch % env.world_size:
        fail(
            f"--global-batch {args.global_batch} does not divide by the {env.world_size} "
            f"workers; pick a multiple of {env.world_size}"
        )
    per_rank = args.global_batch // env.world_size
    say(
        f"rank {env.rank}/{env.world_size} backend {env.backend} device {env.device} "
        f"per_rank_batch {per_rank} checkpoint_dir {root}"
    )
    data = make_dataset(args.seed).to(env.device)
    model, optimizer = build(env, args)
    store = artifact_checkpoints()

    start = resume(root, model, optimizer, args, env, store)
    if start and env.is_main:
        say(f"resumed from step {start}")
    step = start
    model.train()
    while step < args.steps:
        idx = global_batch_indices(args.seed, step, args.global_batch)
        mine = data[idx[env.rank * per_rank : (env.rank + 1) * per_rank].to(env.device)]
        optimizer.zero_grad(set_to_none=True)
        logits = model(mine[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), mine[:, 1:].reshape(-1))
        loss.backward()  # FSDP averages the gradients over ranks: the global-batch mean
        optimizer.step()
        step += 1
        if step % args.log_every == 0:
            mean = env.mean(loss)
            if env.is_main:
                say(f"step {step} loss {mean:.7f}")
        if step % args.checkpoint_every == 0 or step == args.steps:
            path = save(root, step, model, optimizer, args, env, store)
            if env.is_main:
                say(f"checkpoint saved step {step} path {path}")
    if start >= args.steps and env.is_main:
        say(f"checkpoint step {start} already reaches --steps {args.steps}; nothing to train")
    say(f"final step {step} rank {env.rank} params_sha256 {params_sha256(model)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
