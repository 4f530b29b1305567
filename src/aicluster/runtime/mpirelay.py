"""`launcher: mpi`: OpenMPI's mpirun on the gang's first node; its daemons (`orted`) started
on every node by the platform's own workers instead of ssh.

Vocabulary (runtime.launchers has the gang, its nodes and leaders):
- *relay*: served by node 0's leader (the *head*) on the gang's MASTER_ADDR:MASTER_PORT,
  for the attempt only. Lines of JSON over TCP.
- *agent*: every other node's leader. It connects to the relay, waits for one command,
  runs it in the foreground (in its own worker, sandboxed as the team's user) and reports
  its exit code.
- *rsh*: what mpirun runs in ssh's place (`plm_rsh_agent`): `rsh HOST WORDS...` asks the
  relay to run WORDS (joined as ssh would) on HOST's agent and exits with its exit code;
  for the head's own node it runs them itself.
- *rank shim*: mpirun starts `launchers rank -- ARGV` per MPI rank; it adds the torchrun
  variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE from OMPI_COMM_WORLD_*) and
  execs ARGV in its own node's working directory (mpirun asks for rank 0's, which exists
  only on node 0), so a script may use MPI or torch.distributed (MASTER_PORT is a fresh
  port: the gang's own is the relay's).

Invariants:
- Every connection proves knowledge of the attempt's secret (`AICLUSTER_LAUNCH_SECRET`,
  which only the gang's workers get) by an HMAC of the other side's nonce, both ways: a
  stranger can neither make an agent run a command nor pose as the relay.
- An agent runs only `orted` (OpenMPI's daemon), once, without `--daemonize` (mpirun is
  given `--leave-session-attached`): the daemon and the ranks it starts stay in the
  worker's process group, so stopping the gang stops them.
- The head exits with mpirun's exit code; idle agents are then told to exit 0.
- Head, agents and daemons are the rank's own command (runtime.launchers `start`), run by
  the worker inside the workload sandbox: the `os.environ` they pass on is already the
  allow-listed workload environment (runtime.sandbox `workload_env`), never the worker's.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time

from aicluster.runtime.launchers import GANG_ENV, SECRET_ENV, Gang, host

AGENT_WAIT_S = 120.0  # how long an agent tries to reach the relay, the relay to see an agent
LOCAL_HOST_ENV = "AICLUSTER_MPI_LOCAL_HOST"  # rsh runs commands for this host itself
WORKDIR_ENV = "AICLUSTER_MPI_WORKDIR"  # the node's working directory, where its ranks start
_TORCH_RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def _mac(secret: str, nonce: str, who: str) -> str:
    return hmac.new(secret.encode(), f"{nonce}:{who}".encode(), hashlib.sha256).hexdigest()


class _Conn:
    def __init__(self, sock: socket.socket):
        self.sock, self.file = sock, sock.makefile("rwb")

    def send(self, **msg) -> None:
        self.file.write(json.dumps(msg).encode() + b"\n")
        self.file.flush()

    def recv(self) -> dict:
        line = self.file.readline(1 << 20)
        if not line:
            raise ConnectionError("the other side closed the connection")
        return json.loads(line)

    def close(self) -> None:
        for thing in (self.file, self.sock):
            try:
                thing.close()
            except OSError:
                pass


def _client(gang: Gang, secret: str, hello: dict, deadline: float) -> _Conn:
    """A connection to the relay, both sides authenticated; retried until `deadline`."""
    while True:
        try:
            sock = socket.create_connection((gang.master_addr, gang.master_port), timeout=10)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise ConnectionError(
                    f"no mpi relay at {gang.master_addr}:{gang.master_port}"
                ) from None
            time.sleep(0.2)
    sock.settimeout(None)
    conn = _Conn(sock)
    theirs, mine = conn.recv()["nonce"], secrets.token_hex(16)
    conn.send(mac=_mac(secret, theirs, hello["role"]), nonce=mine, **hello)
    if not hmac.compare_digest(conn.recv().get("mac", ""), _mac(secret, mine, "relay")):
        conn.close()
        raise ConnectionError("the mpi relay did not prove the attempt's secret")
    return conn


class Relay:
    """The head's side: agents register by node; each rsh request is handed to its agent."""

    def __init__(self, gang: Gang, secret: str):
        self.gang, self.secret = gang, secret
        self.agents: dict[str, _Conn] = {}
        self.cond = threading.Condition()
        self.server = socket.create_server((gang.master_addr, gang.master_port), reuse_port=False)
        self.closed = False

    def serve(self) -> None:
        threading.Thread(target=self._accept, daemon=True, name="mpi-relay").start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                sock, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(sock,), daemon=True).start()

    def _handle(self, sock: socket.socket) -> None:
        conn = _Conn(sock)
        try:
            nonce = secrets.token_hex(16)
            conn.send(nonce=nonce)
            hello = conn.recv()
            role = str(hello.get("role"))
            if not hmac.compare_digest(str(hello.get("mac")), _mac(self.secret, nonce, role)):
                conn.close()
                return
            conn.send(mac=_mac(self.secret, str(hello.get("nonce")), "relay"))
            if role == "agent":
                with self.cond:
                    self.agents[str(hello["host"])] = conn
                    self.cond.notify_all()
                return  # the connection now belongs to the rsh that uses it
            if role == "rsh":
                conn.send(exit=self._run_on(str(hello["host"]), str(hello["command"])))
        except (OSError, ValueError, KeyError, ConnectionError):
            pass
        conn.close()

    def _run_on(self, name: str, command: str) -> int:
        with self.cond:
            if not self.cond.wait_for(lambda: name in self.agents, timeout=AGENT_WAIT_S):
                print(f"aicluster: mpi: no agent of {name} reached the relay", flush=True)
                return 255
            agent = self.agents.pop(name)
        try:
            agent.send(run=command)
            return int(agent.recv()["exit"])
        except (OSError, ValueError, KeyError, ConnectionError):
            return 255
        finally:
            agent.close()

    def close(self) -> None:
        self.closed = True
        with self.cond:
            idle, self.agents = list(self.agents.values()), {}
        for conn in idle:
            try:
                conn.send(done=True)
            except OSError:
                pass
            conn.close()
        self.server.close()


def mpirun_argv(
    gang: Gang, hostfile: str, argv: list[str], port: int, python: str = sys.executable
) -> list[str]:
    """mpirun over the hostfile's nodes and slots, rank r on the r-th slot, daemons started
    through the platform (rsh) and kept attached, ranks through the rank shim."""
    out = [
        "mpirun",
        "--hostfile",
        hostfile,
        "-np",
        str(gang.world),
        "--map-by",
        "slot",
        "--bind-to",
        "none",
        "--leave-session-attached",
        "--mca",
        "plm_rsh_agent",
        f"{python} -m aicluster.runtime.launchers rsh",
        "--mca",
        "plm_rsh_no_tree_spawn",
        "1",
        "-x",
        "MASTER_ADDR",
        "-x",
        f"MASTER_PORT={port}",
    ]
    if os.geteuid() == 0:  # an unsandboxed node: the workload runs as the platform's user
        out.append("--allow-run-as-root")
    return [*out, python, "-m", "aicluster.runtime.launchers", "rank", "--", *argv]


def _free_port(addr: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def _daemon_env(gang: Gang, node: int) -> dict[str, str]:
    """The environment of a node's orted, hence of its ranks."""
    env = dict(os.environ, NODE_RANK=str(node), GROUP_RANK=str(node))
    env[WORKDIR_ENV] = os.getcwd()  # mpirun's own cwd is on node 0, in rank 0's folder
    if gang.addrs.count(gang.addrs[node]) > 1:
        # Two of the gang's nodes on one machine: OpenMPI's shared-memory transport names its
        # /dev/shm segments by host name, and the two would collide (a segfault in
        # MPI_Allreduce, measured); each node then keeps them in its own worker's TMPDIR.
        env["OMPI_MCA_btl_vader_backing_directory"] = env.get("TMPDIR") or tempfile.gettempdir()
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def head(gang: Gang, hostfile: str, argv: list[str]) -> int:
    secret = os.environ[SECRET_ENV]
    relay = Relay(gang, secret)
    relay.serve()
    cmd = mpirun_argv(gang, hostfile, argv, _free_port(gang.master_addr))
    print(f"aicluster: mpi on node 0: {shlex.join(cmd)}", flush=True)
    # not the daemons' environment: mpirun would hand its OMPI_MCA_* to every node's daemon
    env = dict(os.environ, **{LOCAL_HOST_ENV: host(0)})
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    try:
        return subprocess.call(cmd, env=env)
    finally:
        relay.close()


def agent(gang: Gang, node: int) -> int:
    secret = os.environ[SECRET_ENV]
    try:
        conn = _client(
            gang, secret, {"role": "agent", "host": host(node)}, time.monotonic() + AGENT_WAIT_S
        )
    except ConnectionError as exc:
        print(f"aicluster: mpi agent of node {node}: {exc}", flush=True)
        return 1
    try:
        msg = conn.recv()
        if "run" not in msg:
            return 0  # mpirun ended without needing this node
        words = shlex.split(msg["run"])
        if not words or os.path.basename(words[0]) != "orted":
            print(f"aicluster: mpi agent refused {msg['run'][:200]!r}", flush=True)
            conn.send(exit=126)
            return 1
        code = subprocess.call(["/bin/sh", "-c", msg["run"]], env=_daemon_env(gang, node))
        conn.send(exit=code)
        return code
    except (OSError, ValueError, ConnectionError) as exc:
        print(f"aicluster: mpi agent of node {node}: {exc}", flush=True)
        return 1
    finally:
        conn.close()


def rsh(args: list[str]) -> int:
    """`rsh [ssh options] HOST WORDS...`, as mpirun calls ssh."""
    while args and args[0].startswith("-"):
        args = args[1:]
    if len(args) < 2:
        print("aicluster: mpi rsh: usage: rsh HOST COMMAND...", file=sys.stderr)
        return 255
    name, command = args[0], " ".join(args[1:])
    gang = Gang.from_json(os.environ[GANG_ENV])
    if name == os.environ.get(LOCAL_HOST_ENV):  # the head's own node: its daemon runs here
        env = _daemon_env(gang, 0)
        env.pop(LOCAL_HOST_ENV, None)
        return subprocess.call(["/bin/sh", "-c", command], env=env)
    try:
        conn = _client(
            gang,
            os.environ[SECRET_ENV],
            {"role": "rsh", "host": name, "command": command},
            time.monotonic() + 30,
        )
    except (OSError, ValueError, ConnectionError) as exc:
        print(f"aicluster: mpi rsh to {name}: {exc}", file=sys.stderr, flush=True)
        return 255
    try:
        return int(conn.recv()["exit"])
    except (OSError, ValueError, KeyError, ConnectionError):
        return 0  # the relay is gone: mpirun, its parent, has finished


def rank(argv: list[str]) -> int:
    """Exec `argv` in this node's working directory with the torchrun variables of this
    MPI rank."""
    if os.environ.get(WORKDIR_ENV):
        os.chdir(os.environ[WORKDIR_ENV])
    for ours, theirs in zip(
        _TORCH_RANK_VARS,
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")
        + ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
        strict=True,
    ):
        if theirs in os.environ:
            os.environ[ours] = os.environ[theirs]
    os.execvp(argv[0], argv)
    return 127  # not reached


def main_for(gang: Gang, node: int, hostfile: str, argv: list[str]) -> int:
    """A node leader's part: the head on node 0, an agent elsewhere."""
    return head(gang, hostfile, argv) if node == 0 else agent(gang, node)


def main(args: list[str]) -> int:
    if args[0] == "rsh":
        return rsh(args[1:])
    if args[0] == "rank" and len(args) > 2 and args[1] == "--":
        return rank(args[2:])
    print("usage: launchers rsh HOST COMMAND... | launchers rank -- ARGV...", file=sys.stderr)
    return 2
