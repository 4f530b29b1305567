"""One worker of a job: runs the user's command as a subprocess and keeps its log.

Invariants:
- The command runs in its own session (process group); `stop` kills the whole
  group, and the child is asked to die with its parent (PR_SET_PDEATHSIG), so a
  killed worker leaves no orphan behind.
- The log is a file on the worker's node; readers pull it by byte offset, so a
  reader that restarts resumes exactly where it stopped.
- The command writes to a pipe; a pump thread appends each chunk to that file
  first, then hands it to `on_output(offset, chunk)` (when given), where offset is
  the chunk's absolute offset in the file. The engine streams these chunks off the
  node (engine.logsink), so output survives the node; the file stays the source of
  truth and the catch-up path. A failing `on_output` never stops the pump.
- An exit code is reported only once the pump has drained the pipe (or has had
  its chance to), so a reader that sees the exit has the whole log.
- A start never follows a stop or a fencing status (`status(fence=True)`): the
  control plane that takes over a launch asks each rank once, and a rank that had
  not started then never starts, even when the dead control plane's start call is
  still on its way or half done (it is refused right before the command would run).
  A redone attempt therefore never runs alongside the one it replaces. The look may
  also come before this worker exists at all (the dead control plane had not made it
  yet): `_fenced_elsewhere` is then what refuses the late start (engine.worker_actor
  reads the attempt's fence from the cluster's store, written before the look).
- A worker that runs its node's peer server (runtime.peers: a multi-node gang's inputs)
  serves the node's cache to that gang only, from before its inputs are pulled until
  `stop` or a failed `start`.
"""

from __future__ import annotations

import ctypes
import io
import os
import select
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from aicluster.runtime import envcache, envs
from aicluster.runtime.sandbox import SandboxPolicy, prepare, workload_env, wrap

_PR_SET_PDEATHSIG = 1
_PUMP_CHUNK = 64 * 1024
# Under a burst, a chunk gathers what arrives within this of the previous push (fewer,
# larger pushes); the first bytes after a quiet spell go at once (a dying node's last line).
_COALESCE_S = 0.005
_DRAIN_WAIT_S = 2.0  # how long a reader waits for the pump after the command exited


class Fenced(RuntimeError):
    """A start refused: this worker was stopped, or fenced, before its command ran."""


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

    def __init__(
        self,
        job_id: str,
        attempt: int,
        rank: int,
        scratch_root: str | None = None,
        on_output: Callable[[int, bytes], None] | None = None,
    ):
        """`on_output(offset, chunk)`: called from the pump thread with each chunk of
        output, right after it was appended to the log at `offset`; must not block."""
        self.job_id, self.attempt, self.rank = job_id, attempt, rank
        root = Path(scratch_root) / "aicluster-work" if scratch_root else work_root()
        self.dir = root / f"{job_id}-a{attempt}-r{rank}"
        self.log_path = self.dir / "output.log"
        self._scanned: dict[str, list] = {}  # output path -> scan_output's (entry, file)s
        self.proc: subprocess.Popen | None = None
        self.started_at: float | None = None
        self.on_output = on_output
        self._pump: threading.Thread | None = None
        self._drained = threading.Event()  # the pump reached EOF
        self._drain_given_up = False
        self._peer_server = None  # runtime.peers.PeerServer of this node, while it runs
        # Guards proc's creation against a fence: a start's spawn and a stop or fencing
        # status exclude each other (the actor serves calls on several threads).
        self._spawn_lock = threading.Lock()
        self._fenced = False

    def _refuse_if_fenced(self) -> None:
        """Under `_spawn_lock`: Fenced when a stop or a fencing look came first."""
        if self._fenced:
            raise Fenced("this worker was stopped before its command started")
        if self._fenced_elsewhere():
            self._fenced = True
            raise Fenced(f"attempt {self.attempt} of {self.job_id} was fenced by a takeover")

    def _fenced_elsewhere(self) -> bool:
        """Whether the attempt was fenced before this worker could be asked: none here
        (a subclass that lives in a cluster looks it up there)."""
        return False

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
        peers: dict | None = None,
    ) -> int:
        """`inputs`: [{"path", "env", "manifest": JSON bytes}] materialised read-only under
        the working directory first, from `storage` (a StorageConfig) via the node cache.
        `sandbox`: a SandboxPolicy as a dict (runtime.sandbox): who the command runs as
        and what it must not see; its environment is always built from an allow-list.
        `peers`: this node's place in its gang's swarm (runtime.peers SwarmPlan as a dict,
        with `serve`: this worker runs the node's peer server); the inputs then come from
        the other nodes' caches where they can."""
        with self._spawn_lock:
            if self.proc is not None:
                return self.proc.pid  # idempotent: never start twice
            self._refuse_if_fenced()
        try:
            return self._start(command, env, workdir, inputs, storage, sandbox, peers)
        except BaseException:
            self.close_peers()
            raise

    def _start(self, command, env, workdir, inputs, storage, sandbox, peers) -> int:
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir.parent, 0o711)  # no one lists the other workloads' folders
        cwd = self.dir / "workdir"
        extract_workdir(workdir, cwd)
        policy = SandboxPolicy.from_dict(sandbox)
        job_env = dict(env)
        swarm = self._join_swarm(peers, inputs)
        for item in inputs or []:
            dest = materialise_input(
                item, cwd, storage, say=self._say, swarm=swarm, server=self._peer_server
            )
            if item.get("env"):
                job_env[item["env"]] = str(dest)
        prepared = prepare(policy, self.dir)
        uid = policy.uid if prepared.sandboxed else None
        if job_env.get(envs.SPEC_ENV):  # its own env first, found or built as its own user
            job_env[envs.ROOT_ENV] = str(envs.envs_root())
            if os.environ.get(envcache.MAX_BYTES_ENV):  # the node's limit, if it sets one
                job_env[envcache.MAX_BYTES_ENV] = os.environ[envcache.MAX_BYTES_ENV]
            envs.prepare_user_dir(envs.envs_root(), uid, policy.gid if uid is not None else None)
            command = envs.runner(command)
        full_env = workload_env(job_env, cwd, uid)
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        read_end, write_end = os.pipe()
        self._spawn_lock.acquire()  # released once proc is set (or will never be)
        try:
            self._refuse_if_fenced()
            self.proc = subprocess.Popen(
                wrap(prepared.prefix, command),
                shell=isinstance(command, str) and not prepared.sandboxed,
                cwd=cwd,
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=write_end,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        except BaseException as exc:
            os.close(read_end)
            if isinstance(exc, OSError):
                line = f"aicluster: cannot start command: {exc}\n".encode()
                offset = os.fstat(fd).st_size
                os.write(fd, line)
                self._emit(offset, line)
            os.close(fd)
            raise
        finally:
            self._spawn_lock.release()
            os.close(write_end)  # the command holds the only write end now
        self._pump = threading.Thread(
            target=self._pump_output,
            args=(read_end, fd),
            name=f"log-pump-{self.rank}",
            daemon=True,
        )
        self._pump.start()
        self.started_at = time.time()
        return self.proc.pid

    def _join_swarm(self, peers: dict | None, inputs: list[dict] | None):
        """The SwarmPlan of a multi-node gang's inputs (None: pull from storage alone),
        and this node's peer server started when this worker is to run it."""
        from aicluster.artifacts.manifest import Manifest
        from aicluster.runtime.peers import PeerServer, SwarmPlan, prepare_server

        if not peers or not inputs or len(peers.get("addrs") or ()) < 2:
            return None
        plan = SwarmPlan.from_dict(peers)
        if peers.get("serve") and self._peer_server is None:
            host, port = plan.addrs[plan.node]
            cache = node_cache()
            try:
                self._peer_server = PeerServer(cache, plan.secret, host, port)
            except OSError as exc:
                self._say(f"aicluster inputs: no peer server on {host}:{port} ({exc.strerror})")
                return plan
            prepare_server(
                self._peer_server, cache, [Manifest.from_json(i["manifest"]) for i in inputs], plan
            )
            self._peer_server.start()
        return plan

    def close_peers(self) -> None:
        """Stop serving this node's cache to the gang (the attempt is over)."""
        server, self._peer_server = self._peer_server, None
        if server is not None:
            server.close()

    def _pump_output(self, read_end: int, log_fd: int) -> None:
        """Pipe -> log file -> on_output, chunk by chunk as bytes arrive, until EOF."""
        try:
            offset: int | None = os.fstat(log_fd).st_size
            pushed = 0.0  # monotonic time of the last chunk out
            while chunk := _read_chunk(read_end, pushed + _COALESCE_S):
                pushed = time.monotonic()
                if offset is None:
                    continue  # the log broke: drain, as a full disk would swallow output
                try:
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(log_fd, view) :]
                except OSError:
                    offset = None  # file and stream must agree on offsets: stop both
                    continue
                self._emit(offset, chunk)
                offset += len(chunk)
        except OSError:
            pass
        finally:
            os.close(read_end)
            os.close(log_fd)
            self._drained.set()

    def _say(self, line: str) -> None:
        """A line of the platform's own in the log (and its stream), before the command
        starts: where its inputs are (runtime.inputs_progress)."""
        data = (line + "\n").encode()
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            offset = os.fstat(fd).st_size
            os.write(fd, data)
        finally:
            os.close(fd)
        self._emit(offset, data)

    def _emit(self, offset: int, chunk: bytes) -> None:
        if self.on_output is None:
            return
        try:
            self.on_output(offset, chunk)
        except Exception:  # noqa: BLE001 - streaming is best effort; the file has it
            pass

    def _wait_drained(self) -> None:
        """After the command exited, give the pump a moment to move the pipe's last bytes
        into the file; once only, as a daemon it left behind may hold the pipe forever."""
        if self._pump is None or self._drained.is_set() or self._drain_given_up:
            return
        if not self._drained.wait(_DRAIN_WAIT_S):
            self._drain_given_up = True

    def status(self, log_offset: int, max_bytes: int = 1 << 20, fence: bool = False) -> dict:
        """Exit code (None while running) and the log bytes from `log_offset`. `fence`:
        when the command has not started, it never will (see the module's invariants),
        so "not started" stays true once said."""
        with self._spawn_lock:
            if fence and self.proc is None:
                self._fenced = True
        code = None if self.proc is None else self.proc.poll()
        if code is not None:
            self._wait_drained()
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
        with self._spawn_lock:
            self._fenced = True  # a start still on its way never runs
        self.close_peers()
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
        self._wait_drained()  # so the last chunks reach on_output before the folder goes
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
        """The output's file list as an upload declares it: files over CHUNKED_ABOVE
        bytes as chunks (artifacts.chunks), so a new version of a large file stores only
        the chunks that changed. Hashed once, on threads; `upload_output` reuses it."""
        from aicluster.client.transfer import scan

        target = self.dir / "workdir" / path
        if not target.exists():
            raise FileNotFoundError(f"output {path!r} does not exist in the working directory")
        self._scanned[path] = scan(target)
        return [e.as_dict() for e, _ in self._scanned[path]]

    def upload_output(self, path: str, digests: list[str], storage) -> int:
        """Write the named blobs (whole files or chunks) of the output to storage;
        returns the bytes written."""
        from aicluster.client.transfer import places, read_place, scan
        from aicluster.store.artifacts.backend import open_backend

        scanned = self._scanned.pop(path, None) or scan(self.dir / "workdir" / path)
        where, backend, written = places(scanned), open_backend(storage), 0
        for digest in dict.fromkeys(digests):
            if digest not in where:
                raise ValueError(f"output {path!r} holds no blob {digest}")
            backend.write_blob(digest, read_place(where[digest]))
            written += where[digest][2]
        return written


def _read_chunk(fd: int, not_before: float) -> bytes:
    """Up to _PUMP_CHUNK bytes: what is there, plus what follows until `not_before`
    (monotonic; in the past: nothing more is waited for); b"" only at EOF."""
    chunk = os.read(fd, _PUMP_CHUNK)
    deadline = not_before
    while chunk and len(chunk) < _PUMP_CHUNK:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        more = os.read(fd, _PUMP_CHUNK - len(chunk))
        if not more:
            break  # EOF: the next read says so
        chunk += more
    return chunk


def work_root(environ=os.environ) -> Path:
    """Where this installation's workloads get their folders on this node: inside its
    private Ray temp folder (0700), so two installations never share one, and `down`
    removes them with it."""
    base = environ.get("RAY_TMPDIR") or tempfile.gettempdir()
    return Path(base) / "aicluster-work"


def node_cache():
    """This node's blob cache (runtime.cache), sized by AICLUSTER_CACHE_BYTES."""
    from aicluster.runtime.cache import BlobCache, node_cache_root

    return BlobCache(node_cache_root(), int(os.environ.get("AICLUSTER_CACHE_BYTES", 20 * 2**30)))


def materialise_input(
    item: dict,
    cwd: Path,
    storage,
    say: Callable[[str], None] | None = None,
    swarm=None,
    server=None,
) -> Path:
    """One input in place under `cwd`; with `say`, its progress as log lines
    (runtime.inputs_progress), named by its path. With `swarm` (runtime.peers SwarmPlan)
    the blobs other nodes of the gang own come from their caches, and the ready line says
    how many bytes came from peers and from storage; `server`: this node's peer server."""
    from aicluster.artifacts.manifest import Manifest
    from aicluster.runtime.inputs_progress import Reporter
    from aicluster.runtime.peers import swarm_materialise
    from aicluster.store.artifacts.backend import open_backend

    manifest = Manifest.from_json(item["manifest"])
    cache = node_cache()
    dest = cwd / item["path"]
    dest.parent.mkdir(parents=True, exist_ok=True)
    fetch = open_backend(storage).iter_blob
    reporter = Reporter(item["path"], sum(cache.wanted(manifest).values()), say) if say else None
    add = reporter.add if reporter else None
    note = None
    if swarm is None:
        cache.materialise(manifest, dest, fetch, progress=add)
    else:
        _, counts = swarm_materialise(cache, manifest, dest, fetch, swarm, server, add)
        note = counts.line()
    if reporter:
        reporter.finish(note)
    return dest
