"""End-to-end check of examples/ddp-train/train.py with 2 gloo workers on CPU."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "ddp-train" / "train.py"
TIMEOUT_S = 60
FINAL_RE = re.compile(r"^final step (\d+) rank (\d+) params_sha256 ([0-9a-f]{64})$", re.M)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(rank: int, world: int, port: int) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("AICLUSTER_CHECKPOINT_DIR", "GLOO_SOCKET_IFNAME"):
        env.pop(key, None)
    env.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": str(world),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "NODE_RANK": "0",
            "CUDA_VISIBLE_DEVICES": "",
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
        }
    )
    return env


def run_workers(ckpt_dir: Path, *extra: str, world: int = 2) -> list[str]:
    """Start `world` workers, wait for all, return their stdout; fail on error/timeout."""
    port = free_port()
    cmd = [sys.executable, str(SCRIPT), "--checkpoint-dir", str(ckpt_dir), *extra]
    procs = [
        subprocess.Popen(
            cmd,
            env=worker_env(rank, world, port),
            cwd=str(SCRIPT.parent),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(world)
    ]
    outs = []
    try:
        for rank, proc in enumerate(procs):
            out, err = proc.communicate(timeout=TIMEOUT_S)
            assert proc.returncode == 0, (
                f"rank {rank} exited {proc.returncode}\nstdout:\n{out}\nstderr:\n{err}"
            )
            outs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return outs


def final_lines(outs: list[str]) -> list[tuple[int, int, str]]:
    finals = []
    for rank, out in enumerate(outs):
        found = FINAL_RE.findall(out)
        assert len(found) == 1, f"rank {rank} printed {len(found)} final lines:\n{out}"
        step, r, digest = found[0]
        assert int(r) == rank
        finals.append((int(step), int(r), digest))
    return finals


def test_ddp_train_checkpoint_and_resume(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"

    outs = run_workers(ckpt, "--steps", "40", "--checkpoint-every", "20")
    finals = final_lines(outs)
    assert [f[0] for f in finals] == [40, 40]
    assert finals[0][2] == finals[1][2], "ranks ended with different parameters"
    for out in outs:
        assert "resumed from step" not in out
        assert re.search(r"^step 40 loss \d+\.\d+$", out, re.M), out
    assert re.search(r"^checkpoint saved step 40 path .*ckpt-00000040\.pt$", outs[0], re.M)
    assert "checkpoint saved" not in outs[1]
    assert (ckpt / "ckpt-00000020.pt").is_file()
    assert (ckpt / "ckpt-00000040.pt").is_file()
    hash_at_40 = finals[0][2]

    outs = run_workers(ckpt, "--steps", "60", "--checkpoint-every", "20")
    finals = final_lines(outs)
    for out in outs:
        assert re.search(r"^resumed from step 40$", out, re.M), out
        assert "step 10 loss" not in out  # did not start over
    assert [f[0] for f in finals] == [60, 60]
    assert finals[0][2] == finals[1][2], "ranks ended with different parameters"
    assert finals[0][2] != hash_at_40
    hash_at_60 = finals[0][2]
    assert (ckpt / "ckpt-00000060.pt").is_file()
    # No temp files left behind.
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "ckpt-00000020.pt",
        "ckpt-00000040.pt",
        "ckpt-00000060.pt",
    ]

    # Already at --steps: report and exit 0 without training.
    outs = run_workers(ckpt, "--steps", "60")
    finals = final_lines(outs)
    assert [f[0] for f in finals] == [60, 60]
    assert finals[0][2] == finals[1][2] == hash_at_60
    assert all("step 10 loss" not in out and "checkpoint saved" not in out for out in outs)

    # Reproducible: an uninterrupted 60-step run ends with the same parameters
    # as the 40 + 20 run that resumed from a checkpoint.
    outs = run_workers(tmp_path / "straight", "--steps", "60", "--checkpoint-every", "30")
    assert [f[2] for f in final_lines(outs)] == [hash_at_60, hash_at_60]


def test_bad_arguments_exit_nonzero(tmp_path: Path) -> None:
    env = dict(os.environ)
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--steps", "0", "--checkpoint-dir", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode != 0
    assert "--steps" in proc.stderr
