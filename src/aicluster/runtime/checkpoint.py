"""Checkpoints for training code, kept in the artifact store.

    from aicluster.runtime import checkpoint
    start = 0
    if (ckpt := checkpoint.latest()) is not None:       # a read-only folder, or None
        state = torch.load(ckpt / "state.pt"); start = state["step"]
    ...
    checkpoint.save(folder_or_file, step=step)           # rank 0 only
    checkpoint.save_shards(folder, step=step, rank=rank, all_gather=gather)  # every rank

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

Sharded checkpoints (`save_shards`, e.g. torch.distributed.checkpoint folders): every
rank passes the folder of the files it wrote on its own node; each rank uploads only
the blobs it holds and rank 0 commits one version when all are in, so a version always
holds every rank's files and no bytes go through another rank. Every rank makes the same
`all_gather` calls whatever fails (the failure is raised on every rank), so none is left
waiting in a collective.

This module is client code that runs inside the user's job: it talks to the API
through the SDK (`aicluster.client`), so neither the CLI nor the store is loaded.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
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
        _apply_policy(c, env)
    return f"{v['team']}/{v['name']}:{v['version']}"


def _apply_policy(c, env) -> None:
    """Delete the versions the job spec's `checkpoint` policy does not keep."""
    from aicluster.client import artifacts

    if env.get("AICLUSTER_CHECKPOINT_KEEP_LAST"):
        artifacts.prune(
            c,
            artifact_name(env),
            int(env["AICLUSTER_CHECKPOINT_KEEP_LAST"]),
            int(env.get("AICLUSTER_CHECKPOINT_KEEP_EVERY") or 0),
        )


def save_shards(
    folder: str | Path,
    *,
    step: int | None = None,
    rank: int,
    all_gather: Callable[[object], list],
    metadata: dict | None = None,
    env=os.environ,
) -> str:
    """Every rank of a job calls this with the folder of the files *it* wrote of one
    sharded checkpoint; together they become the newest checkpoint. Returns its name on
    every rank, or raises RuntimeError on every rank naming the ranks that failed.

    `all_gather(obj)` gives every rank's `obj` in rank order (for torch, a wrapper of
    `torch.distributed.all_gather_object`). Files several ranks hold (a folder they
    share) are sent once; two ranks holding one path with different bytes is an error.
    Outside a job the files are copied into AICLUSTER_CHECKPOINT_DIR/ckpt-STEP, which
    every rank must see (one machine, or a shared folder).
    """
    folder = Path(folder)

    def together(fn):
        try:
            out = (fn(), None)
        except Exception as exc:  # noqa: BLE001 - every rank must hear of it
            out = (None, f"{type(exc).__name__}: {exc}")
        everyone = all_gather(out)
        bad = [f"rank {r}: {err}" for r, (_, err) in enumerate(everyone) if err]
        if bad:
            raise RuntimeError(f"sharded checkpoint {folder} not saved: " + "; ".join(bad))
        return [value for value, _ in everyone]

    def check():
        if not folder.is_dir():
            raise FileNotFoundError(f"checkpoint folder {folder} does not exist")

    if "AICLUSTER_TOKEN" not in env:
        return _gather_locally(folder, step, rank, together, check, env)
    return _push_shards(folder, step, rank, together, check, metadata or {}, env)


def _gather_locally(folder: Path, step, rank: int, together, check, env) -> str:
    dest = _local_dir(env) / f"ckpt-{step if step is not None else 'latest'}"
    tmp = dest.with_name(dest.name + ".partial")

    def clear():
        check()
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)

    world = len(together(clear))
    for turn in range(world):  # one rank at a time: ranks may share files

        def copy(turn=turn):
            if rank == turn:
                shutil.copytree(folder, tmp, dirs_exist_ok=True)

        together(copy)

    def publish():
        if rank == 0:
            shutil.rmtree(dest, ignore_errors=True)
            tmp.rename(dest)

    together(publish)
    return str(dest)


def _push_shards(folder: Path, step, rank: int, together, check, metadata: dict, env) -> str:
    from aicluster.client import artifacts, transfer

    scanned: list = []

    def scan():
        check()
        scanned.extend(transfer.scan(folder))
        return [e.as_dict() for e, _ in scanned], sorted(transfer.places(scanned))

    held = together(scan)  # per rank: (its file entries, the blob digests it holds)
    upload: dict = {}  # rank 0's upload until it is committed

    def begin():
        if rank != 0:
            return None
        files: dict[str, dict] = {}
        for r, (entries, _) in enumerate(held):
            for e in entries:
                if files.setdefault(e["path"], e)["sha256"] != e["sha256"]:
                    raise ValueError(f"{e['path']}: rank {r} holds other bytes than rank 0")
        body = {
            "name": artifact_name(env),
            "kind": "checkpoint",
            "files": [files[p] for p in sorted(files)],
            "metadata": {**metadata, **({"step": step} if step is not None else {})},
            "producer_job": env.get("AICLUSTER_JOB_ID"),
        }
        with _client(env) as c:
            upload.update(c.request_json("POST", "/v1/artifacts/uploads", json=body))
        return {"upload_id": upload["upload_id"], "missing": upload["missing"]}

    try:
        plan = together(begin)[0]
        owner: dict[str, int] = {}  # each missing blob is sent by the first rank holding it
        for r, (_, digests) in enumerate(held):
            for d in digests:
                owner.setdefault(d, r)
        where = transfer.places(scanned)

        def send():
            with _client(env) as c:
                for d in plan["missing"]:
                    if owner.get(d) == rank:
                        artifacts.put_blob(c, plan["upload_id"], d, where[d])

        together(send)

        def commit():
            if rank != 0:
                return None
            with _client(env) as c:
                v = c.request_json("POST", f"/v1/artifacts/uploads/{plan['upload_id']}/commit")
                upload.clear()
                _apply_policy(c, env)
            return f"{v['team']}/{v['name']}:{v['version']}"

        return together(commit)[0]
    finally:
        if upload:  # not committed: drop what was sent
            with contextlib.suppress(Exception), _client(env) as c:
                c.request("DELETE", f"/v1/artifacts/uploads/{upload['upload_id']}")


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
