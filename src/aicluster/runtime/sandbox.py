"""The sandbox a workload (a job's worker or a service's engine) runs in.

Vocabulary:
- *workload user*: the unprivileged Unix uid/gid a team's workloads run as (one per
  team, allocated by the control plane and kept in the store); never the control
  plane's own user.
- *hidden paths*: folders the workload must not see: the control plane's home
  (admin token, state.db, every team's logs), Ray's temp/session folder and its
  token, the operator's home. Each is replaced by an empty read-only tmpfs.
- *shared paths*: folders an operator declares as shared storage (an NFS mount, a
  scratch area), bound read-write; everything else keeps its ordinary file modes.

Invariants, when the node can sandbox (it runs as root and has bubblewrap and setpriv):
- The command runs as the workload user with no supplementary groups, no
  capabilities and no_new_privs, in its own mount namespace with a private /tmp;
  only its own work folder is bound back under /tmp.
- The Python it runs (the platform's interpreter and venv) is bound back read-only
  even where it lies under a hidden path, so `python train.py` works.
- The command and everything it starts die with the sandbox: it runs in a PID namespace
  of its own (`--unshare-pid`) whose init is bubblewrap, asked to die with its parent
  (`--die-with-parent`; the worker asks the same of bubblewrap), and the kernel kills
  every process of a namespace whose init is gone. (A parent-death signal alone is not
  enough: bubblewrap runs without CAP_KILL, so its death cannot signal a process of
  another user; sandboxed replicas outlived their workers that way.) The workload sees a
  /proc of its namespace only: its own processes, not the node's command lines.
- The environment is built from an allow-list (`workload_env`), never copied
  whole from the worker: the operator's AWS_*/cloud credentials, RAY_* settings and
  AICLUSTER_HOME never reach a workload.
When the node cannot sandbox, the command runs as the worker's user with the same
scrubbed environment; the control plane warns at start (log, `aicluster up`, an event).
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

# Variables a workload may inherit from the worker's own environment (locale, time
# zone, the operator's fabric settings); everything else comes from the job spec
# and the platform (torchrun variables, AICLUSTER_* values, the job's scoped token).
INHERITED = ("LANG", "LANGUAGE", "TZ", "LD_LIBRARY_PATH", "OMP_NUM_THREADS")
INHERITED_PREFIXES = ("LC_", "NCCL_", "GLOO_", "UCX_")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

SANDBOX_WARNING = (
    "workloads are NOT sandboxed on this machine (that needs root, bubblewrap and setpriv): "
    "jobs and engines run as the platform's own user and can read its home, tokens and "
    "state; do not share this installation between teams that must not trust each other"
)


@dataclass(frozen=True)
class SandboxPolicy:
    """What the control plane asks of every node for one workload."""

    uid: int
    gid: int
    hidden: tuple[str, ...] = ()
    shared: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {
            "uid": self.uid,
            "gid": self.gid,
            "hidden": list(self.hidden),
            "shared": list(self.shared),
        }

    @classmethod
    def from_dict(cls, d: dict | None) -> SandboxPolicy | None:
        if not d:
            return None
        return cls(
            int(d["uid"]), int(d["gid"]), tuple(d.get("hidden", ())), tuple(d.get("shared", ()))
        )


@dataclass
class Prepared:
    """The argv prefix and environment for one command."""

    prefix: list[str] = field(default_factory=list)
    sandboxed: bool = False


def node_can_sandbox() -> bool:
    return os.geteuid() == 0 and bool(shutil.which("bwrap")) and bool(shutil.which("setpriv"))


def node_hidden_paths(environ=os.environ) -> list[str]:
    """What this node itself knows must be hidden: its own home and Ray's folders."""
    out = [os.path.expanduser("~")]
    for key in ("AICLUSTER_HOME", "RAY_TMPDIR"):
        if environ.get(key):
            out.append(environ[key])
    if environ.get("RAY_AUTH_TOKEN_PATH"):
        out.append(os.path.dirname(environ["RAY_AUTH_TOKEN_PATH"]))
    return out


def workload_env(
    job_env: dict[str, str], workdir: Path, uid: int | None, environ=os.environ
) -> dict[str, str]:
    """The whole environment of a workload: allow-listed inheritance + the job's own."""
    env = {k: v for k, v in environ.items() if k in INHERITED or k.startswith(INHERITED_PREFIXES)}
    home = workdir.parent / "home"
    env.update(
        PATH=os.path.dirname(sys.executable) + os.pathsep + SYSTEM_PATH,
        HOME=str(home),
        TMPDIR=str(workdir.parent / "tmp"),
        PYTHONUNBUFFERED="1",
        USER=f"aic{uid}" if uid is not None else environ.get("USER", "aicluster"),
    )
    env["LOGNAME"] = env["USER"]
    env.update(job_env)
    return env


def _python_roots() -> list[str]:
    """Folders a workload's Python needs: the venv, the base interpreter, and the
    source checkout of an editable install of aicluster."""
    import aicluster

    roots = {
        sys.prefix,
        sys.base_prefix,
        os.path.realpath(sys.prefix),
        os.path.realpath(sys.base_prefix),
    }
    pkg = Path(aicluster.__file__).resolve().parent
    src = pkg.parent
    roots.add(str(src.parent if (src.parent / "pyproject.toml").exists() else src))
    return sorted(roots)


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _traversable_parents(paths: list[str], masked: list[str]) -> list[str]:
    parents: set[str] = set()
    for path in paths:
        for parent in Path(path).parents:
            if str(parent) not in masked and _under(str(parent), masked):
                parents.add(str(parent))
    argv: list[str] = []
    for parent in sorted(parents, key=lambda p: (p.count("/"), p)):
        argv += ["--perms", "0711", "--dir", parent]
    return argv


def bwrap_prefix(policy: SandboxPolicy, job_dir: Path) -> list[str]:
    """bubblewrap + setpriv argv that runs the rest of the line in the sandbox.

    Mount order matters: later mounts cover earlier ones. Hidden folders are covered
    last but one (so one under a bound-back Python root stays hidden); the job's own
    folder is bound last."""
    hidden = sorted({os.path.realpath(p) for p in (*policy.hidden, *node_hidden_paths()) if p})
    hidden = [h for h in hidden if h not in ("/", "/usr", "/bin", "/lib", "/etc")]
    argv = ["bwrap", "--dev-bind", "/", "/", "--tmpfs", "/tmp", "--die-with-parent"]
    # A PID namespace of its own, with its own /proc: when bubblewrap goes, the kernel
    # kills every process left in it (see the module's invariants); and the workload sees
    # only its own processes' command lines.
    argv += ["--unshare-pid", "--proc", "/proc"]
    for h in hidden:
        if os.path.isdir(h) and not h.startswith("/tmp/"):
            argv += ["--tmpfs", h]
    masked = ["/tmp", *hidden]
    roots = [r for r in _python_roots() if os.path.isdir(r) and _under(r, masked)]
    shared = [s for s in policy.shared if os.path.isdir(s)]
    # bwrap makes the folders above a bound path 0700: make them traversable instead
    argv += _traversable_parents([*roots, *shared, str(job_dir)], masked)
    for root in roots:
        argv += ["--ro-bind", root, root]
    for h in hidden:  # again, over any Python root that contains them
        if os.path.isdir(h) and _under(h, roots):
            argv += ["--tmpfs", h]
    for s in shared:
        argv += ["--bind", s, s]
    argv += ["--bind", str(job_dir), str(job_dir), "--chdir", str(job_dir / "workdir")]
    argv += [
        "setpriv",
        f"--reuid={policy.uid}",
        f"--regid={policy.gid}",
        "--clear-groups",
        "--no-new-privs",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--",
    ]
    return argv


def prepare(policy: SandboxPolicy | None, job_dir: Path) -> Prepared:
    """Make `job_dir` the workload user's own and say how to start its command."""
    for sub in ("home", "tmp"):
        (job_dir / sub).mkdir(parents=True, exist_ok=True)
    if policy is None or not node_can_sandbox():
        return Prepared()
    for dirpath, dirnames, filenames in os.walk(job_dir):
        os.lchown(dirpath, policy.uid, policy.gid)
        for name in filenames + dirnames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p) and os.stat(p).st_nlink > 1:
                continue  # a hard link into the node's read-only blob cache: leave it
            os.lchown(p, policy.uid, policy.gid)
    os.chmod(job_dir, 0o700)
    return Prepared(prefix=bwrap_prefix(policy, job_dir), sandboxed=True)


def wrap(prefix: list[str], command: str | list[str]) -> list[str] | str:
    if not prefix:
        return command
    if isinstance(command, str):
        return [*prefix, "/bin/sh", "-c", command]
    return [*prefix, *command]
