"""One worker of a job: runs the user's command as a subprocess and keeps its log.

Invariants:
- The command runs in its own session (process group); `stop` kills the whole
  group, and the child is asked to die with its parent (PR_SET_PDEATHSIG), so a
  killed worker leaves no orphan behind.
- The log is a file on the worker's node; readers pull it by byte offset, so a
  reader that restarts resumes exactly where it stopped.
"""

from __future__ import annotations

import ctypes
import io
import os
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

from aicluster.runtime.sandbox import SandboxPolicy, prepare, workload_env, wrap

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def extract_workdir(blob: bytes | None, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    if not blob:
        return
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        tar.extractall(dest, filter="data")


class WorkerProcess:
    """Lives in a Ray actor on the worker's node (see engine.ray_engine)."""

    def __init__(self, job_id: str, attempt: int, rank: int, scratch_root: str | None = None):
        self.job_id, self.attempt, self.rank = job_id, attempt, rank
        root = Path(scratch_root) / "aicluster-work" if scratch_root else work_root()
        self.dir = root / f"{job_id}-a{attempt}-r{rank}"
        self.log_path = self.dir / "output.log"
        self.proc: subprocess.Popen | None = None
        self.started_at: float | None = None

    def node_address(self, host: str) -> tuple[str, int]:
        return host, free_port(host)

    def start(
        self,
        command,
        env: dict[str, str],
        workdir: bytes | None,
        inputs: list[dict] | None = None,
        storage=None,
        sandbox: dict | None = None,
    ) -> int:
        """`inputs`: [{"path", "env", "manifest": JSON bytes}] materialised read-only under
        the working directory first, from `storage` (a StorageConfig) via the node cache.
        `sandbox`: a SandboxPolicy as a dict (runtime.sandbox): who the command runs as
        and what it must not see; its environment is always built from an allow-list."""
        if self.proc is not None:
            return self.proc.pid  # idempotent: never start twice
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir.parent, 0o711)  # no one lists the other workloads' folders
        cwd = self.dir / "workdir"
        extract_workdir(workdir, cwd)
        policy = SandboxPolicy.from_dict(sandbox)
        job_env = dict(env)
        for item in inputs or []:
            dest = materialise_input(item, cwd, storage)
            if item.get("env"):
                job_env[item["env"]] = str(dest)
        prepared = prepare(policy, self.dir)
        full_env = workload_env(job_env, cwd, policy.uid if prepared.sandboxed else None)
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        log = os.fdopen(fd, "ab", buffering=0)
        try:
            self.proc = subprocess.Popen(
                wrap(prepared.prefix, command),
                shell=isinstance(command, str) and not prepared.sandboxed,
                cwd=cwd,
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        except OSError as exc:
            log.write(f"aicluster: cannot start command: {exc}\n".encode())
            raise
        finally:
            log.close()
        self.started_at = time.time()
        return self.proc.pid

    def status(self, log_offset: int, max_bytes: int = 1 << 20) -> dict:
        """Exit code (None while running) and the log bytes from `log_offset`."""
        code = None if self.proc is None else self.proc.poll()
        chunk = b""
        if self.log_path.exists():
            with open(self.log_path, "rb") as f:
                f.seek(log_offset)
                chunk = f.read(max_bytes)
        return {
            "started": self.proc is not None,
            "pid": self.proc.pid if self.proc else None,
            "exit_code": code,
            "log": chunk,
        }

    def stop(self, grace: float = 5.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        self._signal(signal.SIGKILL)  # whatever of the group is left
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None
        self.cleanup()  # the control plane has pulled the log before it stops a worker
        return code

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def cleanup(self) -> None:
        for dirpath, _, _ in os.walk(self.dir):  # inputs are read-only folders
            os.chmod(dirpath, 0o755)
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- outputs (rank 0, after the command exited 0) -----------------------------------

    def scan_output(self, path: str) -> list[dict]:
        from aicluster.artifacts.manifest import scan_folder

        target = self.dir / "workdir" / path
        if not target.exists():
            raise FileNotFoundError(f"output {path!r} does not exist in the working directory")
        return [
            {"path": e.path, "size": e.size, "sha256": e.sha256} for e, _ in scan_folder(target)
        ]

    def upload_output(self, path: str, digests: list[str], storage) -> int:
        """Write the named blobs of the output to storage; returns the bytes written."""
        from aicluster.artifacts.manifest import scan_folder
        from aicluster.store.artifacts.backend import open_backend

        backend = open_backend(storage)
        want, written = set(digests), 0
        for entry, file in scan_folder(self.dir / "workdir" / path):
            if entry.sha256 in want:
                want.discard(entry.sha256)
                with open(file, "rb") as f:
                    backend.write_blob(entry.sha256, iter(lambda: f.read(1 << 20), b""))
                written += entry.size
        return written


def work_root(environ=os.environ) -> Path:
    """Where this installation's workloads get their folders on this node: inside its
    private Ray temp folder (0700), so two installations never share one, and `down`
    removes them with it."""
    base = environ.get("RAY_TMPDIR") or tempfile.gettempdir()
    return Path(base) / "aicluster-work"


def materialise_input(item: dict, cwd: Path, storage) -> Path:
    from aicluster.artifacts.manifest import Manifest
    from aicluster.runtime.cache import BlobCache, node_cache_root
    from aicluster.store.artifacts.backend import open_backend

    manifest = Manifest.from_json(item["manifest"])
    cache = BlobCache(node_cache_root(), int(os.environ.get("AICLUSTER_CACHE_BYTES", 20 * 2**30)))
    dest = cwd / item["path"]
    dest.parent.mkdir(parents=True, exist_ok=True)
    cache.materialise(manifest, dest, open_backend(storage).iter_blob)
    return dest
