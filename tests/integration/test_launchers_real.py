"""Each launcher runs a real 2-node job on the session's Ray cluster through the real API:
4 workers of 2 CPUs each, 2 per 4-CPU node (accelerate, per worker on CPU: 2 of 4 CPUs),
whose processes check their own world (rank, world size, local rank, node, master, the
hostfile) and do a gloo all-reduce; under mpi also an MPI_Allreduce (OpenMPI's libmpi
through ctypes). The selected tests' jobs are submitted at once and run one after the
other (each takes the whole cluster). torchrun also runs a gang of 3 with 2 workers on one
node and 1 on the other."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from aicluster.client.api import ApiError

from harness import TERMINAL

CHECK = r"""
import ctypes, json, os, sys
launcher = [a for a in sys.argv[1:] if not a.startswith("--")][0]
import torch
import torch.distributed as dist

extra = {}
if launcher == "mpi":
    lib = ctypes.CDLL("libmpi.so.40", mode=ctypes.RTLD_GLOBAL)
    def sym(name):
        return ctypes.c_void_p(ctypes.addressof(ctypes.c_char.in_dll(lib, name)))
    assert lib.MPI_Init(None, None) == 0
    comm, r, s, out = sym("ompi_mpi_comm_world"), ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    lib.MPI_Comm_rank(comm, ctypes.byref(r))
    lib.MPI_Comm_size(comm, ctypes.byref(s))
    val = ctypes.c_int(r.value + 1)
    lib.MPI_Allreduce(ctypes.byref(val), ctypes.byref(out), 1, sym("ompi_mpi_int"),
                      sym("ompi_mpi_op_sum"), comm)
    extra["mpi"] = [r.value, s.value, out.value]
if launcher == "accelerate":
    from accelerate import Accelerator
    state = Accelerator()
    extra["accelerate"] = [state.process_index, state.num_processes, str(state.distributed_type)]
else:
    dist.init_process_group("gloo")
if launcher == "deepspeed":
    extra["args"] = [a for a in sys.argv[1:] if a.startswith("--")]
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
# one write(2) per line: the processes of a node share their launcher's stdout
os.write(1, b"WORLD " + json.dumps(dict(
    rank=rank, world=world, local=int(os.environ["LOCAL_RANK"]),
    node=int(os.environ["NODE_RANK"]), node_id=os.environ["AICLUSTER_NODE_ID"],
    master=os.environ["MASTER_ADDR"], sum=t.item(),
    hostfile=open(os.environ["AICLUSTER_HOSTFILE"]).read(), **extra)).encode() + b"\n")
dist.destroy_process_group()
if launcher == "mpi":
    lib.MPI_Finalize()
"""


def _deepspeed_path() -> str | None:
    """A PATH entry whose `python` has deepspeed: $AICLUSTER_TEST_DEEPSPEED_VENV/bin (a venv
    that also sees the platform's torch), or the platform's own when it has deepspeed."""
    venv = os.environ.get("AICLUSTER_TEST_DEEPSPEED_VENV")
    if venv and (Path(venv) / "bin" / "python").exists():
        return str(Path(venv) / "bin")
    if importlib.util.find_spec("deepspeed") is not None:
        return ""
    return None


SKIPS = {
    "mpi": None if shutil.which("mpirun") else "mpirun absent (make install adds openmpi-bin)",
    "deepspeed": None
    if _deepspeed_path() is not None
    else "deepspeed is not installed (not in the default install: README, launchers); "
    "set AICLUSTER_TEST_DEEPSPEED_VENV to a venv that has it",
    "accelerate": None
    if importlib.util.find_spec("accelerate")
    else "accelerate absent (the torch extra installs it)",
}
LAUNCHERS = ("torchrun", "accelerate", "deepspeed", "mpi")
# accelerate on CPU makes every worker a machine of its own: one per node shows all of it
WORKERS = {"accelerate": 2}
# the jobs run one after another on a 2-core machine that others share: room for all four
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def jobs(admin, tmp_path_factory, request):
    """The job of every launcher selected here, submitted at once: {launcher: job id}."""
    wanted = {
        item.callspec.params["launcher"]
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec")
    }
    root = tmp_path_factory.mktemp("launchers")
    (root / "work").mkdir()
    (root / "work" / "check.py").write_text(CHECK)
    out = {}
    for launcher in LAUNCHERS:
        if SKIPS.get(launcher) or launcher not in wanted:
            continue
        spec = {
            "kind": "job",
            "name": f"launch-{launcher}",
            "workers": WORKERS.get(launcher, 4),
            "resources": {"cpus": 8 // WORKERS.get(launcher, 4)},
            "working_dir": "work",
            "launcher": launcher,
            "command": f"python check.py {launcher}",
        }
        if launcher == "deepspeed" and _deepspeed_path():
            spec["env"] = {"PATH": f"{_deepspeed_path()}:/usr/local/bin:/usr/bin:/bin"}
        path = root / f"{launcher}.yaml"
        path.write_text(yaml.safe_dump(spec))
        out[launcher] = admin.submit_file(path)["id"]
    return out


def _worlds(admin, job: dict) -> list[dict]:
    lines = []
    for rank in range(job["workers"]):
        text = admin.logs(job["id"], rank=rank)[0].decode(errors="replace")
        lines += [json.loads(line[6:]) for line in text.splitlines() if line.startswith("WORLD ")]
    return sorted(lines, key=lambda w: w["rank"])


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_launcher_runs_a_two_node_job_that_sees_its_world(admin, jobs, launcher):
    if SKIPS.get(launcher):
        pytest.skip(SKIPS[launcher])
    job = admin.wait(jobs[launcher], TERMINAL, timeout=840)
    n = job["workers"]
    logs = [admin.logs(job["id"], rank=r)[0].decode(errors="replace")[-3000:] for r in range(n)]
    assert job["status"] == "SUCCEEDED", f"{job['reason']}: {job['message']}\n" + "\n".join(logs)
    worlds = _worlds(admin, job)
    assert [w["rank"] for w in worlds] == list(range(n)), logs
    total = n * (n + 1) / 2
    assert all(w["world"] == n and w["sum"] == total for w in worlds), "gloo all-reduce"
    assert {w["master"] for w in worlds} == {"127.0.0.1"}
    per = n // 2
    assert {w["hostfile"] for w in worlds} == {f"aic-node-0 slots={per}\naic-node-1 slots={per}\n"}
    by_node: dict[int, list[dict]] = {}
    for w in worlds:
        by_node.setdefault(w["node"], []).append(w)
    assert sorted(by_node) == [0, 1]
    for members in by_node.values():
        assert sorted(m["local"] for m in members) == list(range(per)), "per node: its workers"
        assert len({m["node_id"] for m in members}) == 1
    placement = job["placement"]
    node_ids = [by_node[k][0]["node_id"] for k in (0, 1)]
    assert node_ids[0] != node_ids[1] and set(node_ids) == set(placement)
    if launcher in ("torchrun", "deepspeed", "mpi"):  # ranks are node-major under these
        assert [w["node"] for w in worlds] == [0, 0, 1, 1]
    if launcher == "mpi":
        assert [w["mpi"] for w in worlds] == [[r, 4, 10] for r in range(4)]
    if launcher == "accelerate":
        assert [w["accelerate"][:2] for w in worlds] == [[r, n] for r in range(n)]
        assert {w["accelerate"][2] for w in worlds} == {"DistributedType.MULTI_CPU"}
    if launcher == "deepspeed":
        assert [w["args"] for w in worlds] == [[f"--local_rank={w['local']}"] for w in worlds]


def test_the_api_refuses_an_unknown_launcher_naming_the_field(admin):
    spec = {"kind": "job", "name": "launch-bad", "command": "true", "launcher": "horovod"}
    with pytest.raises(ApiError) as err:
        admin.submit(spec, None)
    assert err.value.status_code == 422
    issue = next(i for i in err.value.issues if i["field"] == "launcher")
    assert "torchrun" in issue["message"] and "mpi" in issue["message"]


def test_torchrun_with_unequal_workers_per_node(admin, tmp_path):
    """3 workers of 2 CPUs on two 4-CPU nodes: 2 on one node, 1 on the other. Each node's
    torchrun starts its own count (--nproc-per-node 2 and 1); torch's agents agree on the
    global ranks (node-major), so the world is 3 and the all-reduce sums 1+2+3."""
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "check.py").write_text(CHECK)
    spec = {
        "kind": "job",
        "name": "launch-unequal",
        "workers": 3,
        "resources": {"cpus": 2},
        "working_dir": "work",
        "launcher": "torchrun",
        "command": "python check.py torchrun",
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    job = admin.wait(admin.submit_file(tmp_path / "job.yaml")["id"], TERMINAL, timeout=840)
    logs = [admin.logs(job["id"], rank=r)[0].decode(errors="replace")[-3000:] for r in range(3)]
    assert job["status"] == "SUCCEEDED", f"{job['reason']}: {job['message']}\n" + "\n".join(logs)
    worlds = _worlds(admin, job)
    assert [w["rank"] for w in worlds] == [0, 1, 2], logs
    assert all(w["world"] == 3 and w["sum"] == 6.0 for w in worlds), "gloo all-reduce"
    sizes = sorted(job["placement"].count(n) for n in set(job["placement"]))
    assert sizes == [1, 2], job["placement"]
    big = 0 if job["placement"].count(job["placement"][0]) == 2 else 1
    slots = [2, 1] if big == 0 else [1, 2]
    assert {w["hostfile"] for w in worlds} == {
        f"aic-node-0 slots={slots[0]}\naic-node-1 slots={slots[1]}\n"
    }
    # node-major ranks, each node's local ranks 0..its count-1
    assert [w["node"] for w in worlds] == [0] * slots[0] + [1] * slots[1]
    assert [w["local"] for w in worlds] == list(range(slots[0])) + list(range(slots[1]))
