#!/usr/bin/env python3
"""Small, reproducible PyTorch DistributedDataParallel training example.

The aicluster platform starts this script once per worker with a
torchrun-compatible environment (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK,
LOCAL_RANK, NODE_RANK, CUDA_VISIBLE_DEVICES).  Without WORLD_SIZE it runs as a
single process, so ``python train.py`` works on its own.

It trains an MLP on a synthetic classification problem generated from
``--seed``, writes atomic checkpoints (rank 0 only) every ``--checkpoint-every``
steps and at the end, and resumes from the newest checkpoint in
``--checkpoint-dir`` when started again.

Lines meant for programs (each flushed as it is written):

    resumed from step S
    step S loss L                                   (every 10 steps, every rank)
    checkpoint saved step S path P                  (rank 0)
    final step S rank R params_sha256 HEX           (once, every rank)
"""

from __future__ import annotations

import argparse
import array
import datetime
import hashlib
import math
import os
import re
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

NUM_SAMPLES = 4096
NUM_FEATURES = 20
NUM_CLASSES = 4
HIDDEN = 64
LOG_EVERY = 10
KEEP_CHECKPOINTS = 3
PG_TIMEOUT = datetime.timedelta(seconds=120)
CKPT_RE = re.compile(r"^ckpt-(\d{8})\.pt$")


def say(msg: str) -> None:
    print(msg, flush=True)


def fail(msg: str, code: int = 2) -> None:
    print(f"train.py: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


# --------------------------------------------------------------------------- args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="DDP training example with checkpoint/resume for aicluster."
    )
    parser.add_argument(
        "--steps", type=int, default=200, help="total optimizer steps to reach (default 200)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=32, help="per-worker batch size (default 32)"
    )
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default 0.05)")
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=50,
        help="save a checkpoint every N steps (default 50)",
    )
    parser.add_argument(
        "--checkpoint-dir",
        default=os.environ.get("AICLUSTER_CHECKPOINT_DIR") or "./checkpoints",
        help="checkpoint folder (default $AICLUSTER_CHECKPOINT_DIR, else ./checkpoints)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=1234,
        help="seed for data, model init and data order (default 1234)",
    )
    args = parser.parse_args(argv)

    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if args.batch_size < 1:
        parser.error(f"--batch-size must be >= 1, got {args.batch_size}")
    if not (math.isfinite(args.lr) and args.lr > 0):
        parser.error(f"--lr must be a finite number > 0, got {args.lr}")
    if args.checkpoint_every < 1:
        parser.error(f"--checkpoint-every must be >= 1, got {args.checkpoint_every}")
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    if not str(args.checkpoint_dir).strip():
        parser.error("--checkpoint-dir must not be empty")
    return args


def env_int(name: str, default: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
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
    """Where this worker sits in the job and what it computes on."""

    def __init__(self) -> None:
        raw_world = os.environ.get("WORLD_SIZE")
        self.distributed = raw_world is not None and raw_world.strip() != ""
        if self.distributed:
            self.world_size = env_int("WORLD_SIZE")
            self.rank = env_int("RANK")
            self.local_rank = env_int("LOCAL_RANK", 0)
            if self.world_size < 1:
                fail(f"WORLD_SIZE must be >= 1, got {self.world_size}")
            if not 0 <= self.rank < self.world_size:
                fail(f"RANK must be in [0, {self.world_size}), got {self.rank}")
            if self.local_rank < 0:
                fail(f"LOCAL_RANK must be >= 0, got {self.local_rank}")
            for name in ("MASTER_ADDR", "MASTER_PORT"):
                if not os.environ.get(name, "").strip():
                    fail(f"environment variable {name} is required when WORLD_SIZE is set")
            env_int("MASTER_PORT")
        else:
            self.world_size, self.rank, self.local_rank = 1, 0, 0

        if torch.cuda.is_available():
            count = torch.cuda.device_count()
            # One visible device per worker (the platform's usual setup): cuda:0.
            index = 0 if count == 1 else self.local_rank % count
            torch.cuda.set_device(index)
            self.device = torch.device("cuda", index)
            self.backend = "nccl"
        else:
            torch.set_num_threads(1)
            self.device = torch.device("cpu")
            self.backend = "gloo"
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

    def barrier(self) -> None:
        if not self.distributed:
            return
        if self.backend == "nccl":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()

    def broadcast_from_main(self, value):
        if not self.distributed:
            return value
        box = [value]
        dist.broadcast_object_list(
            box, src=0, device=self.device if self.backend == "nccl" else None
        )
        return box[0]

    def close(self) -> None:
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()


# --------------------------------------------------------------------------- data / model


def make_dataset(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic 4-class problem labelled by a fixed random 'teacher' network."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(NUM_SAMPLES, NUM_FEATURES, generator=gen)
    w1 = torch.randn(NUM_FEATURES, 32, generator=gen)
    w2 = torch.randn(32, NUM_CLASSES, generator=gen)
    y = (torch.tanh(x @ w1) @ w2).argmax(dim=1)
    return x, y


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(NUM_FEATURES, HIDDEN),
            nn.ReLU(),
            nn.Linear(HIDDEN, HIDDEN),
            nn.ReLU(),
            nn.Linear(HIDDEN, NUM_CLASSES),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def params_sha256(model: nn.Module) -> str:
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        t = p.detach().cpu().contiguous()
        try:
            h.update(t.numpy().tobytes())
        except (RuntimeError, TypeError):  # torch built without numpy
            if t.dtype != torch.float32:
                raise
            h.update(array.array("f", t.reshape(-1).tolist()).tobytes())
    return h.hexdigest()


# --------------------------------------------------------------------------- checkpoints


def list_checkpoints(folder: str) -> list[tuple[int, str]]:
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        m = CKPT_RE.match(name)
        if m:
            found.append((int(m.group(1)), os.path.join(folder, name)))
    return sorted(found)


def artifact_checkpoints():
    """aicluster's checkpoint store when this runs as an aicluster job, else None."""
    if not os.environ.get("AICLUSTER_TOKEN"):
        return None
    try:
        from aicluster.runtime import checkpoint
    except ImportError:
        return None
    return checkpoint


def save_checkpoint(
    folder: str, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, meta: dict
) -> str:
    os.makedirs(folder, exist_ok=True)
    final = os.path.join(folder, f"ckpt-{step:08d}.pt")
    fd, tmp = tempfile.mkstemp(prefix=".ckpt-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(
                {
                    "step": step,
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    **meta,
                },
                fh,
            )
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:  # make the rename durable
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
    for _, old in list_checkpoints(folder)[:-KEEP_CHECKPOINTS]:
        try:
            os.unlink(old)
        except FileNotFoundError:
            pass
    return final


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ckpt_dir = os.path.abspath(os.path.expanduser(args.checkpoint_dir))
    env = Dist()
    try:
        return train(args, env, ckpt_dir)
    finally:
        env.close()


def train(args: argparse.Namespace, env: Dist, ckpt_dir: str) -> int:
    per_rank = NUM_SAMPLES // env.world_size
    if args.batch_size > per_rank:
        fail(
            f"--batch-size {args.batch_size} is larger than the {per_rank} samples "
            f"each of the {env.world_size} workers gets"
        )

    say(
        f"rank {env.rank}/{env.world_size} backend {env.backend} device {env.device} "
        f"checkpoint_dir {ckpt_dir}"
    )

    torch.manual_seed(args.seed)
    x_all, y_all = make_dataset(args.seed)
    x_all, y_all = x_all.to(env.device), y_all.to(env.device)
    model = MLP().to(env.device)  # same init everywhere; DDP also broadcasts rank 0's
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    # Rank 0 picks the checkpoint so every rank resumes from the same step. Inside an
    # aicluster job checkpoints live in the artifact store (any node can resume); each
    # rank materialises the newest one on its own node.
    store = artifact_checkpoints()
    if store is not None:
        found = store.latest()
        ckpt_dir_in = str(found) if found is not None else ckpt_dir
        latest = list_checkpoints(ckpt_dir_in) if found is not None else []
    else:
        ckpt_dir_in = ckpt_dir
        latest = list_checkpoints(ckpt_dir)
    start_step = env.broadcast_from_main(latest[-1][0] if latest else 0)
    if start_step > 0:
        path = os.path.join(ckpt_dir_in, f"ckpt-{start_step:08d}.pt")
        if not os.path.exists(path):
            fail(
                f"rank {env.rank} cannot see checkpoint {path} chosen by rank 0 "
                f"(is --checkpoint-dir on storage shared by all workers?)",
                code=1,
            )
        state = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if int(state["step"]) != start_step:
            fail(f"checkpoint {path} says step {state['step']}, expected {start_step}", code=1)
        if state.get("seed", args.seed) != args.seed:
            print(
                f"warning: checkpoint was made with --seed {state['seed']}, now --seed {args.seed}",
                file=sys.stderr,
                flush=True,
            )
        if state.get("world_size", env.world_size) != env.world_size:
            print(
                f"warning: checkpoint was made with {state['world_size']} workers, "
                f"now {env.world_size}; the data split changes",
                file=sys.stderr,
                flush=True,
            )
        say(f"resumed from step {start_step}")
    env.barrier()  # nobody writes or prunes checkpoints while others still load

    if start_step >= args.steps:
        say(f"checkpoint step {start_step} already reaches --steps {args.steps}; nothing to train")
        say(f"final step {start_step} rank {env.rank} params_sha256 {params_sha256(model)}")
        return 0

    ddp_model: nn.Module = model
    if env.distributed:
        ddp_model = DistributedDataParallel(
            model, device_ids=[env.device.index] if env.device.type == "cuda" else None
        )

    sampler = DistributedSampler(
        range(NUM_SAMPLES),
        num_replicas=env.world_size,
        rank=env.rank,
        shuffle=True,
        seed=args.seed,
        drop_last=True,
    )
    batches_per_epoch = len(sampler) // args.batch_size
    meta = {
        "seed": args.seed,
        "world_size": env.world_size,
        "batch_size": args.batch_size,
        "lr": args.lr,
    }

    step = start_step
    epoch, order = -1, None
    last_saved = start_step
    ddp_model.train()
    while step < args.steps:
        # The batch depends only on (seed, step), so a resumed run sees the
        # same data as an uninterrupted one.
        want_epoch, b = divmod(step, batches_per_epoch)
        if want_epoch != epoch:
            epoch = want_epoch
            sampler.set_epoch(epoch)
            order = torch.tensor(list(iter(sampler)), dtype=torch.long, device=env.device)
        idx = order[b * args.batch_size : (b + 1) * args.batch_size]

        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp_model(x_all[idx]), y_all[idx])
        loss.backward()
        optimizer.step()
        step += 1

        if step % LOG_EVERY == 0:
            say(f"step {step} loss {loss.item():.6f}")
        if step % args.checkpoint_every == 0 or step == args.steps:
            if env.is_main:
                path = save_checkpoint(ckpt_dir, step, model, optimizer, meta)
                if store is not None:
                    path = store.save(path, step=step)  # one file, a new version
                say(f"checkpoint saved step {step} path {path}")
            env.barrier()
            last_saved = step

    assert last_saved == step
    say(f"final step {step} rank {env.rank} params_sha256 {params_sha256(model)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
