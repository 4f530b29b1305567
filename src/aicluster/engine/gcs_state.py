"""Where the Ray head keeps its cluster state (Ray's GCS), so that a head lost and started
again finds the cluster it had: `aicluster up --ray-gcs-state SPEC`.

Vocabulary: *memory* (Ray's default) keeps the GCS tables in the head's process: a new
head starts an empty cluster, the worker nodes' raylets cannot rejoin it (they belong
to the old cluster and exit), every actor and task on them is lost and the control plane
re-runs that work. *redis://HOST:PORT* keeps them in an external Redis (Ray's GCS fault
tolerance), *rocksdb:PATH* in a RocksDB folder that must outlive the head's
machine (a volume that is attached to the new head). With either, a head started again
on the same address within Ray's reconnect window (`gcs_rpc_server_reconnect_timeout_s`,
60 s by default) gets the same cluster back: worker nodes reconnect and running actors
and tasks keep running (measured: bench/head_loss.py, docs/state.md).

Invariants: the spec is checked before anything starts and names `--ray-gcs-state` when
it is bad; the settings reach only the head's `ray start` (its environment), never the
workloads. A Redis password is refused: Ray hands it to its GCS process on the command
line, which every process of the machine (workloads included) can read in /proc; keep
that Redis on an address only the head can reach instead, or use rocksdb.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

OPTION = "--ray-gcs-state"
_HOST = re.compile(r"^[A-Za-z0-9.:\[\]-]{1,253}$")


class GcsStateError(ValueError):
    pass


def parse(spec: str | None) -> dict[str, str]:
    """The head's environment for `spec` (None or 'memory': nothing)."""
    if spec is None or spec == "memory":
        return {}
    if spec.startswith("rocksdb:"):
        path = Path(spec[len("rocksdb:") :]).expanduser()
        if not path.is_absolute():
            raise GcsStateError(f"{OPTION} rocksdb:PATH needs an absolute PATH, not {str(path)!r}")
        return {"RAY_gcs_storage": "rocksdb", "RAY_gcs_storage_path": str(path)}
    if spec.startswith("redis://") or spec.startswith("rediss://"):
        try:
            url = urlsplit(spec)
            port = url.port
        except ValueError as exc:
            raise GcsStateError(f"{OPTION}: {exc}") from None
        host = url.hostname or ""
        if not host or not _HOST.match(host) or port is None:
            raise GcsStateError(f"{OPTION} needs redis://HOST:PORT, got {_masked(spec)!r}")
        if url.password is not None or url.username:
            raise GcsStateError(
                f"{OPTION}: a Redis password would be on the command line of Ray's GCS process, "
                "readable by every process of the head (workloads included): give a Redis "
                "that only the head can reach, without a password, or use rocksdb:PATH"
            )
        if url.path not in ("", "/") or url.query or url.fragment:
            raise GcsStateError(f"{OPTION}: only redis://HOST:PORT is accepted")
        address = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
        env = {
            "RAY_REDIS_ADDRESS": ("rediss://" if url.scheme == "rediss" else "") + address,
            # One cluster's state per namespace: the head started again finds it by name.
            "RAY_external_storage_namespace": "aicluster",
        }
        return env
    raise GcsStateError(
        f"{OPTION} must be memory, redis://HOST:PORT or rocksdb:/ABSOLUTE/PATH, "
        f"not {_masked(spec)!r}"
    )


def describe(spec: str | None) -> str:
    """The spec as the user may see it (a password masked)."""
    return _masked(spec or "memory")


def _masked(spec: str) -> str:
    return re.sub(r"(://[^:@/]*:)[^@/]*@", r"\1***@", spec)
