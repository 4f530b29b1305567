"""A job's `launcher`: which program starts its processes on each node (runtime.launchers).

- `plain` (the default): one process per worker, the job's command as is, with the
  torchrun-compatible environment (runtime.torchenv).
- `torchrun`: `python -m torch.distributed.run` once per node, `--nproc-per-node` = the
  job's workers on that node, static rendezvous at the gang's master; the command is its
  script and arguments. Restarts stay the platform's (`--max-restarts 0`).
- `accelerate`: `accelerate launch --config_file` with a config written from the gang.
- `deepspeed`: DeepSpeed's per-node launcher (`deepspeed.launcher.launch`) with the
  world info and hostfile it expects.
- `mpi`: OpenMPI's `mpirun` on rank 0's node with a hostfile of the gang's nodes and
  slots; its daemons reach the other nodes through the platform's own workers, not ssh.

Invariants: the launcher never changes where a job runs (placement and resources are
the scheduler's alone), only what runs on the nodes it was given; a spec that validates
has a command its launcher can start (`check_command`, the same parsing the nodes use).
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Literal, get_args

Launcher = Literal["plain", "torchrun", "accelerate", "deepspeed", "mpi"]
LAUNCHERS: tuple[str, ...] = get_args(Launcher)
SCRIPT_LAUNCHERS = ("torchrun", "accelerate", "deepspeed")  # the command is their script
_PYTHON = re.compile(r"^python[0-9.]*$")
_PYTHON_FLAGS = ("-u", "-B", "-O", "-OO", "-s", "-E")


def user_argv(launcher: str, command: str | list[str]) -> list[str]:
    """The job's command as argv: for mpi a string runs under /bin/sh (as `plain` does);
    for the others it is the script and its arguments, split as a shell would."""
    if isinstance(command, list):
        return list(command)
    if launcher == "mpi":
        return ["/bin/sh", "-c", command]
    return shlex.split(command)


def script_args(argv: list[str], module_flag: str, no_python_flag: str) -> list[str]:
    """The launcher's arguments for the job's command: `python [-u] train.py ARGS` and
    `train.py ARGS` run the script under the launcher's Python, `python -m pkg ARGS` the
    module, anything else (`./run.sh`, `bash -c ...`) as an executable of its own."""
    if not argv:
        raise ValueError("the command is empty")
    if _PYTHON.match(os.path.basename(argv[0])):
        rest = list(argv[1:])
        while rest and rest[0] in _PYTHON_FLAGS:
            rest.pop(0)
        if not rest:
            raise ValueError(f"{argv[0]} needs a script or -m module to launch")
        if rest[0] == "-m":
            if len(rest) < 2:
                raise ValueError("-m needs a module name")
            return [module_flag, *rest[1:]]
        if rest[0].startswith("-"):
            raise ValueError(f"python option {rest[0]!r} cannot be passed through a launcher")
        return rest
    if argv[0].endswith(".py"):
        return list(argv)
    return [no_python_flag, *argv]


def check_command(launcher: str, command: str | list[str]) -> None:
    """ValueError when `launcher` cannot start `command` (submit time, not on the nodes)."""
    if launcher in SCRIPT_LAUNCHERS:
        script_args(user_argv(launcher, command), "--module", "--no-python")
