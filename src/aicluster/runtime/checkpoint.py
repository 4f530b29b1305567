"""Checkpoints for training code, kept in the artifact store.

    from aicluster.runtime import checkpoint
    start = 0
    if (ckpt := checkpoint.latest()) is not None:       # a read-only folder, or None
        state = torch.load(ckpt / "state.pt"); start = state["step"]
    ...
    checkpoint.save(folder_or_file, step=step)           # rank 0 only

Inside an aicluster job the platform provides AICLUSTER_URL, AICLUSTER_TOKEN (the job's
scoped token: its team's artifacts, its own checkpoints; dead when the attempt ends),
AICLUSTER_TEAM and AICLUSTER_JOB_NAME;
checkpoints are versions of the artifact `TEAM/JOBNAME-ckpt` (kind checkpoint), so a
job restarted or preempted onto any node resumes from the newest one. `latest()`
materialises it through the node's blob cache. Outside a job (no AICLUSTER_TOKEN)
both fall back to the folder AICLUSTER_CHECKPOINT_DIR (or ./checkpoints). With the
job spec's `checkpoint: {keep_last, keep_every}` (AICLUSTER_CHECKPOINT_KEEP_LAST and
_KEEP_EVERY), each save then deletes the versions that policy does not keep. A save that
would take the team past its storage quota raises the SDK's ApiError (status 413, its
message naming the quota, the team's usage and the bytes asked); nothing of it is kept.

This module is client code that runs inside the user's job: it talks to the API
through the SDK (`aicluster.client`), so neither the CLI nor the store is loaded.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def artifact_name(env=os.environ) -> str:
    return f"{env.get('AICLUSTER_TEAM', 'default')}/{env.get('AICLUSTER_JOB_NAME', 'job')}-ckpt"


def _client(env):
    from aicluster.client.api import Client

    return Client(env["AICLUSTER_URL"], env["AICLUSTER_TOKEN"])


def _local_dir(env) -> Path:
    return Path(env.get("AICLUSTER_CHECKPOINT_DIR", "checkpoints"))


def save(path: str | Path, *, step: int | None = None, env=os.environ) -> str:
    """Store the folder or file at `path` as the newest checkpoint; returns its name."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint path {path} does not exist")
    meta = {"step": step} if step is not None else {}
    if "AICLUSTER_TOKEN" not in env:
        dest = _local_dir(env) / f"ckpt-{step if step is not None else 'latest'}"
        tmp = dest.with_name(dest.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        (shutil.copytree if path.is_dir() else _copy_file)(path, tmp)
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
        return str(dest)
    from aicluster.client import artifacts

    with _client(env) as c:
        v = artifacts.push(
            c,
            path,
            artifact_name(env),
            "checkpoint",
            metadata=meta,
            producer_job=env.get("AICLUSTER_JOB_ID"),
        )
        if env.get("AICLUSTER_CHECKPOINT_KEEP_LAST"):  # the job spec's `checkpoint` policy
            artifacts.prune(
                c,
                artifact_name(env),
                int(env["AICLUSTER_CHECKPOINT_KEEP_LAST"]),
                int(env.get("AICLUSTER_CHECKPOINT_KEEP_EVERY") or 0),
            )
    return f"{v['team']}/{v['name']}:{v['version']}"


def _copy_file(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True)
    shutil.copy2(src, dst / src.name)


def latest(dest: str | Path | None = None, env=os.environ) -> Path | None:
    """The newest checkpoint as a folder on this node, or None when there is none."""
    if "AICLUSTER_TOKEN" not in env:
        found = sorted(
            (p for p in _local_dir(env).glob("ckpt-*") if not p.name.endswith(".partial")),
            key=lambda p: p.stat().st_mtime,
        )
        return found[-1] if found else None
    from aicluster.client import artifacts
    from aicluster.client.api import ApiError
    from aicluster.runtime.cache import BlobCache, node_cache_root

    with _client(env) as c:
        try:
            v = artifacts.version(c, artifact_name(env) + ":latest")
        except ApiError as exc:
            if exc.status_code == 404:
                return None
            raise
        root = Path(dest) if dest else Path(tempfile.gettempdir()) / "aicluster-ckpt"
        # named by content, so a folder left by another installation is never mistaken for it
        target = root / f"{v['team']}-{v['name']}-{v['version']}-{v['manifest_sha256'][:16]}"
        cache = BlobCache(node_cache_root(), int(env.get("AICLUSTER_CACHE_BYTES", 20 * 2**30)))
        return artifacts.pull(c, f"{artifact_name(env)}:{v['version']}", target, cache=cache)[1]
