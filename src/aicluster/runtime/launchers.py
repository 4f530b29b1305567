"""Launchers: what runs on each node of a gang when a job names a `launcher` (specs.launchers).

Vocabulary:
- *gang*: the job's workers (platform ranks 0..W-1) with `placement[rank]` their node. The
  gang's *nodes* are numbered in order of first appearance (NODE_RANK, runtime.torchenv);
  a node's ranks are its *local ranks* in rank order; its *leader* is local rank 0.
- *per-node* launchers (torchrun, deepspeed, mpi, and accelerate on GPUs) run one launcher
  process per node, in the leader's worker, which starts one process per worker of that
  node (`--nproc-per-node`/slots = the node's worker count). The other workers of the node
  only hold their resources: they print what they are and exit 0 (the job succeeds when
  every rank exited 0, so it ends with its leaders). The leader sees the GPUs of all its
  node's workers (CUDA_VISIBLE_DEVICES, in local-rank order), so process i uses cuda:i.
- *per-worker*: accelerate on CPU (accelerate's MULTI_CPU starts one process per machine
  without mpirun): each worker is a machine of its own (num_machines = W, machine_rank =
  RANK), and the platform's torchrun variables reach the script unchanged.
- *host names*: nodes are `aic-node-K` in hostfiles and world info (two Ray nodes may
  share an IP, e.g. on one test machine), never resolved: every launcher is given the
  master's address, and mpi reaches the other nodes through the platform (runtime.mpirelay).

Invariants:
- Everything the launcher needs travels in the worker's environment (`AICLUSTER_GANG`,
  JSON) and is turned into files and arguments on the node, in `.aicluster-launch/` of the
  worker's working directory: the hostfile (`$AICLUSTER_HOSTFILE`, `aic-node-K slots=N`,
  written for every launcher), accelerate's config, the gang itself.
- Elastic restarts stay the platform's: torchrun runs with `--max-restarts 0`, and a
  launcher that exits non-zero fails its rank, hence the attempt.
- This module imports only the standard library (and the pure parsing of specs.launchers):
  it runs as the workload (sandboxed, as the team's user) before anything else.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shlex
import sys
from dataclasses import dataclass

from aicluster.specs.launchers import script_args, user_argv

GANG_ENV = "AICLUSTER_GANG"
SECRET_ENV = "AICLUSTER_LAUNCH_SECRET"  # per attempt: authenticates mpi's relay (mpirelay)
HOSTFILE_ENV = "AICLUSTER_HOSTFILE"
LAUNCH_DIR = ".aicluster-launch"
PER_WORKER_ONLY = ("plain",)


@dataclass(frozen=True)
class Gang:
    """Who is where, as every launcher needs it (the same value on every rank)."""

    launcher: str
    nodes: tuple[tuple[int, ...], ...]  # platform ranks per node, in NODE_RANK order
    addrs: tuple[str, ...]  # each node's address
    gpus: tuple[tuple[int, ...], ...]  # each node's GPU ids, its ranks' in local-rank order
    master_addr: str
    master_port: int
    use_gpu: bool = False

    @classmethod
    def of(cls, launcher, placement, ips, gpu_ids, master_addr: str, master_port: int) -> Gang:
        """`placement[rank]` node ids, `ips[rank]` and `gpu_ids[rank]` as the workers found
        them on their nodes."""
        order: list[str] = []
        for node in placement:
            if node not in order:
                order.append(node)
        nodes = tuple(tuple(r for r, n in enumerate(placement) if n == node) for node in order)
        return cls(
            launcher=launcher,
            nodes=nodes,
            addrs=tuple(ips[ranks[0]] for ranks in nodes),
            gpus=tuple(tuple(int(g) for r in ranks for g in gpu_ids[r]) for ranks in nodes),
            master_addr=master_addr,
            master_port=int(master_port),
            use_gpu=any(gpu_ids),
        )

    @property
    def world(self) -> int:
        return sum(len(ranks) for ranks in self.nodes)

    @property
    def per_node(self) -> bool:
        return not (self.launcher == "accelerate" and not self.use_gpu)

    def node_of(self, rank: int) -> int:
        return next(k for k, ranks in enumerate(self.nodes) if rank in ranks)

    def to_json(self) -> str:
        return json.dumps(
            {
                "launcher": self.launcher,
                "nodes": self.nodes,
                "addrs": self.addrs,
                "gpus": self.gpus,
                "master_addr": self.master_addr,
                "master_port": self.master_port,
                "use_gpu": self.use_gpu,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Gang:
        d = json.loads(text)
        return cls(
            launcher=d["launcher"],
            nodes=tuple(tuple(n) for n in d["nodes"]),
            addrs=tuple(d["addrs"]),
            gpus=tuple(tuple(g) for g in d["gpus"]),
            master_addr=d["master_addr"],
            master_port=int(d["master_port"]),
            use_gpu=bool(d["use_gpu"]),
        )


def host(node: int) -> str:
    return f"aic-node-{node}"


def hostfile_text(gang: Gang) -> str:
    """OpenMPI's and DeepSpeed's hostfile: one `NAME slots=N` line per node."""
    return "".join(f"{host(k)} slots={len(ranks)}\n" for k, ranks in enumerate(gang.nodes))


def torchrun_argv(gang: Gang, node: int, argv: list[str], python: str = "python") -> list[str]:
    """The real `torch.distributed.run` for one node: static rendezvous at the gang's
    master (node 0's agent hosts the store), this node's workers as its processes."""
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(len(gang.nodes)),
        "--node-rank",
        str(node),
        "--nproc-per-node",
        str(len(gang.nodes[node])),
        "--rdzv-backend",
        "static",
        "--master-addr",
        gang.master_addr,
        "--master-port",
        str(gang.master_port),
        "--max-restarts",
        "0",
        *script_args(argv, "--module", "--no-python"),
    ]


def accelerate_config(gang: Gang, rank: int) -> dict:
    """accelerate's config file for `rank`'s launcher: per node on GPUs (MULTI_GPU: it runs
    torchrun with num_processes / num_machines per machine), per worker on CPU."""
    if gang.per_node:
        sizes = {len(r) for r in gang.nodes}
        if len(sizes) != 1:
            raise ValueError(
                "accelerate on GPUs needs the same number of workers on every node "
                f"(this gang has {[len(r) for r in gang.nodes]}); use launcher: torchrun"
            )
        machines, machine_rank = len(gang.nodes), gang.node_of(rank)
    else:
        machines, machine_rank = gang.world, rank
    return {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "MULTI_GPU" if gang.use_gpu else "MULTI_CPU",
        "num_machines": machines,
        "machine_rank": machine_rank,
        "num_processes": gang.world,
        "main_process_ip": gang.master_addr,
        "main_process_port": gang.master_port,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": not gang.use_gpu,
        "gpu_ids": "all",
        "mixed_precision": "no",
        "main_training_function": "main",
        "debug": False,
    }


def yaml_text(config: dict) -> str:
    """Flat mapping as YAML (JSON scalars are YAML scalars)."""
    return "".join(f"{k}: {json.dumps(v)}\n" for k, v in config.items())


def accelerate_argv(config_file: str, argv: list[str]) -> list[str]:
    return [
        "accelerate",
        "launch",
        "--config_file",
        config_file,
        *script_args(argv, "--module", "--no_python"),
    ]


def deepspeed_world_info(gang: Gang) -> dict[str, list[int]]:
    """DeepSpeed's world info, {host: [slot per process]}: the GPU of each of the node's
    workers (its first one), or 0..N-1 on CPU. Its launcher sets CUDA_VISIBLE_DEVICES to
    these, so they must be the ids the node granted."""
    out = {}
    for k, ranks in enumerate(gang.nodes):
        if gang.use_gpu and len(gang.gpus[k]) >= len(ranks):
            per = len(gang.gpus[k]) // len(ranks)
            out[host(k)] = [gang.gpus[k][i * per] for i in range(len(ranks))]
        else:
            out[host(k)] = list(range(len(ranks)))
    return out


def deepspeed_argv(gang: Gang, node: int, argv: list[str], python: str = "python") -> list[str]:
    """What DeepSpeed's runner (pdsh) runs on each node, with the platform in pdsh's place."""
    info = json.dumps(deepspeed_world_info(gang)).encode()
    return [
        python,
        "-u",
        "-m",
        "deepspeed.launcher.launch",
        f"--world_info={base64.urlsafe_b64encode(info).decode()}",
        f"--node_rank={node}",
        f"--master_addr={gang.master_addr}",
        f"--master_port={gang.master_port}",
        *script_args(argv, "--module", "--no_python"),
    ]


# -- on the control plane's side: what each rank's worker runs ---------------------------


def rank_command(
    launcher: str,
    command: str | list[str],
    gang: Gang,
    rank: int,
    python: str = sys.executable,
    secret: str | None = None,
) -> tuple[str | list[str], dict[str, str]]:
    """The command `rank`'s worker runs and what to add to its environment."""
    if launcher in PER_WORKER_ONLY:
        return command, {}
    node = gang.node_of(rank)
    if gang.per_node and gang.nodes[node][0] != rank:
        leader = gang.nodes[node][0]
        note = (
            f"aicluster: rank {rank} is local rank {gang.nodes[node].index(rank)} of node "
            f"{node}; its process runs under the {launcher} launcher of rank {leader}"
        )
        return ["echo", note], {}
    env = {GANG_ENV: gang.to_json(), SECRET_ENV: secret or secrets.token_hex(16)}
    if gang.per_node and gang.use_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gang.gpus[node])
    argv = user_argv(launcher, command)
    return [python, "-m", "aicluster.runtime.launchers", "start", str(rank), "--", *argv], env


# -- on the node, as the workload ----------------------------------------------------------


def write_files(gang: Gang, rank: int, where: str) -> dict[str, str]:
    """The files of `rank`'s launcher under `where`; their paths by kind."""
    os.makedirs(where, exist_ok=True)
    paths = {"hostfile": os.path.join(where, "hostfile"), "gang": os.path.join(where, "gang.json")}
    with open(paths["hostfile"], "w") as f:
        f.write(hostfile_text(gang))
    with open(paths["gang"], "w") as f:
        f.write(gang.to_json())
    if gang.launcher == "accelerate":
        paths["accelerate"] = os.path.join(where, "accelerate.yaml")
        with open(paths["accelerate"], "w") as f:
            f.write(yaml_text(accelerate_config(gang, rank)))
    return paths


def start(rank: int, argv: list[str]) -> int:
    """Write the launcher's files and exec it (mpi: run the relay, rank 0 also mpirun)."""
    gang = Gang.from_json(os.environ[GANG_ENV])
    node = gang.node_of(rank)
    paths = write_files(gang, rank, os.path.join(os.getcwd(), LAUNCH_DIR))
    os.environ[HOSTFILE_ENV] = paths["hostfile"]
    if gang.launcher == "mpi":
        from aicluster.runtime import mpirelay

        return mpirelay.main_for(gang, node, paths["hostfile"], argv)
    if gang.launcher == "torchrun":
        cmd = torchrun_argv(gang, node, argv)
    elif gang.launcher == "accelerate":
        cmd = accelerate_argv(paths["accelerate"], argv)
    elif gang.launcher == "deepspeed":
        cmd = deepspeed_argv(gang, node, argv)
    else:
        raise ValueError(f"unknown launcher {gang.launcher!r}")
    print(f"aicluster: {gang.launcher} on node {node}: {shlex.join(cmd)}", flush=True)
    os.execvp(cmd[0], cmd)
    return 127  # not reached


def main(args: list[str]) -> int:
    if len(args) >= 3 and args[0] == "start" and args[2] == "--":
        try:
            return start(int(args[1]), args[3:])
        except (ValueError, OSError) as exc:
            print(f"aicluster: launcher: {exc}", file=sys.stderr, flush=True)
            return 2
    if args and args[0] in ("rsh", "rank"):
        from aicluster.runtime import mpirelay

        return mpirelay.main(args)
    print("usage: python -m aicluster.runtime.launchers start RANK -- ARGV...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
