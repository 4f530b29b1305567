"""Launchers (runtime.launchers, runtime.mpirelay): the command lines, config files and
hostfiles each launcher gets from a gang description, the spec field, and the mpi relay's
authentication on real loopback sockets."""

from __future__ import annotations

import base64
import json
import threading

import pytest

from aicluster.runtime import mpirelay
from aicluster.runtime.launchers import (
    GANG_ENV,
    SECRET_ENV,
    Gang,
    accelerate_argv,
    accelerate_config,
    deepspeed_argv,
    deepspeed_world_info,
    hostfile_text,
    rank_command,
    script_args,
    torchrun_argv,
    user_argv,
    write_files,
    yaml_text,
)
from aicluster.specs import SpecError, load_spec_text

from harness import free_port

# Ranks 0, 1 and 3 on node A, rank 2 on node B: nodes in order of first appearance.
PLACEMENT = ["A", "A", "B", "A"]
IPS = ["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.1"]


def gang(launcher="torchrun", gpus=None, placement=PLACEMENT, ips=IPS, port=29400) -> Gang:
    gpus = gpus or [[] for _ in placement]
    return Gang.of(launcher, placement, ips, gpus, ips[0], port)


def test_gang_groups_ranks_by_node_in_order_of_first_appearance():
    g = gang(gpus=[[0], [1], [5], [2]])
    assert g.nodes == ((0, 1, 3), (2,))
    assert g.addrs == ("10.0.0.1", "10.0.0.2")
    assert g.gpus == ((0, 1, 2), (5,)) and g.use_gpu
    assert g.world == 4 and g.node_of(3) == 0 and g.node_of(2) == 1
    assert Gang.from_json(g.to_json()) == g
    assert hostfile_text(g) == "aic-node-0 slots=3\naic-node-1 slots=1\n"


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        (["python", "train.py", "--lr", "1"], ["train.py", "--lr", "1"]),
        (["python3.11", "-u", "train.py"], ["train.py"]),
        (["train.py", "x"], ["train.py", "x"]),
        (["python", "-m", "pkg.main", "--x"], ["--module", "pkg.main", "--x"]),
        (["./run.sh", "a"], ["--no-python", "./run.sh", "a"]),
    ],
)
def test_the_command_becomes_the_launchers_script_and_arguments(argv, want):
    assert script_args(argv, "--module", "--no-python") == want


def test_a_python_option_a_launcher_cannot_pass_is_refused():
    with pytest.raises(ValueError, match="-c"):
        script_args(["python", "-c", "print(1)"], "--module", "--no-python")
    with pytest.raises(ValueError, match="script or -m"):
        script_args(["python"], "--module", "--no-python")


def test_string_commands_split_as_a_shell_would_and_run_under_sh_for_mpi():
    assert user_argv("torchrun", "python train.py --name 'a b'") == [
        "python",
        "train.py",
        "--name",
        "a b",
    ]
    assert user_argv("mpi", "echo $RANK") == ["/bin/sh", "-c", "echo $RANK"]
    assert user_argv("mpi", ["./a.out"]) == ["./a.out"]


def test_torchrun_runs_once_per_node_with_the_nodes_workers_and_static_rendezvous():
    g = gang()
    assert torchrun_argv(g, 1, ["python", "train.py", "--epochs", "2"]) == [
        "python",
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "static",
        "--master-addr",
        "10.0.0.1",
        "--master-port",
        "29400",
        "--max-restarts",
        "0",
        "train.py",
        "--epochs",
        "2",
    ]
    assert torchrun_argv(g, 0, ["train.py"])[8] == "3"  # --nproc-per-node of node 0


def test_per_node_launchers_run_on_each_nodes_leader_and_the_others_only_hold():
    g = gang(gpus=[[0], [1], [5], [2]])
    cmd, env = rank_command("torchrun", "python train.py", g, 0, python="/py", secret="s")
    assert cmd == ["/py", "-m", "aicluster.runtime.launchers", "start", "0", "--"] + [
        "python",
        "train.py",
    ]
    assert Gang.from_json(env[GANG_ENV]) == g and env[SECRET_ENV] == "s"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2", "the leader sees its node's GPUs"
    assert rank_command("torchrun", "x.py", g, 2, python="/py")[0][:4] == [
        "/py",
        "-m",
        "aicluster.runtime.launchers",
        "start",
    ]
    held, held_env = rank_command("deepspeed", "x.py", g, 3)
    assert held[0] == "echo" and "local rank 2 of node 0" in held[1] and held_env == {}
    assert rank_command("plain", "echo hi", g, 1) == ("echo hi", {})


def test_accelerate_on_cpu_makes_every_worker_a_machine_of_its_own():
    g = gang("accelerate")
    assert not g.per_node
    cmd, _ = rank_command("accelerate", "train.py", g, 3, python="/py")
    assert cmd[3:5] == ["start", "3"], "no rank only holds on CPU"
    cfg = accelerate_config(g, 3)
    assert cfg["distributed_type"] == "MULTI_CPU" and cfg["use_cpu"] is True
    assert (cfg["num_machines"], cfg["machine_rank"], cfg["num_processes"]) == (4, 3, 4)
    assert (cfg["main_process_ip"], cfg["main_process_port"]) == ("10.0.0.1", 29400)
    assert accelerate_argv("/w/acc.yaml", ["python", "-m", "m"]) == [
        "accelerate",
        "launch",
        "--config_file",
        "/w/acc.yaml",
        "--module",
        "m",
    ]


def test_accelerate_on_gpus_is_per_node_and_needs_even_nodes():
    even = Gang.of("accelerate", ["A", "B", "A", "B"], IPS, [[0], [0], [1], [1]], "h", 1)
    cfg = accelerate_config(even, 1)
    assert cfg["distributed_type"] == "MULTI_GPU" and cfg["use_cpu"] is False
    assert (cfg["num_machines"], cfg["machine_rank"], cfg["num_processes"]) == (2, 1, 4)
    with pytest.raises(ValueError, match=r"same number of workers on every node.*\[3, 1\]"):
        accelerate_config(gang("accelerate", gpus=[[0], [1], [0], [2]]), 0)


def test_accelerate_config_is_yaml_accelerate_reads(tmp_path):
    yaml = pytest.importorskip("yaml")
    cfg = accelerate_config(gang("accelerate"), 2)
    assert yaml.safe_load(yaml_text(cfg)) == cfg
    paths = write_files(gang("accelerate"), 2, str(tmp_path / "launch"))
    assert yaml.safe_load(open(paths["accelerate"]).read())["machine_rank"] == 2
    assert open(paths["hostfile"]).read() == "aic-node-0 slots=3\naic-node-1 slots=1\n"


def test_deepspeed_gets_world_info_with_the_granted_gpus_and_its_node_rank():
    g = gang("deepspeed", gpus=[[4], [6], [1], [7]])
    assert deepspeed_world_info(g) == {"aic-node-0": [4, 6, 7], "aic-node-1": [1]}
    assert deepspeed_world_info(gang("deepspeed")) == {"aic-node-0": [0, 1, 2], "aic-node-1": [0]}
    argv = deepspeed_argv(g, 1, ["python", "train.py", "--deepspeed"])
    assert argv[:4] == ["python", "-u", "-m", "deepspeed.launcher.launch"]
    info = json.loads(base64.urlsafe_b64decode(argv[4].split("=", 1)[1]))
    assert info == {"aic-node-0": [4, 6, 7], "aic-node-1": [1]}
    assert argv[5:] == [
        "--node_rank=1",
        "--master_addr=10.0.0.1",
        "--master_port=29400",
        "train.py",
        "--deepspeed",
    ]


def test_mpirun_gets_the_hostfile_every_rank_and_the_platforms_rsh():
    g = gang("mpi")
    argv = mpirelay.mpirun_argv(g, "/w/hostfile", ["/bin/sh", "-c", "x"], 4321, python="/py")
    assert argv[:5] == ["mpirun", "--hostfile", "/w/hostfile", "-np", "4"]
    at = argv.index("plm_rsh_agent")
    assert argv[at + 1] == "/py -m aicluster.runtime.launchers rsh"
    assert "--leave-session-attached" in argv, "daemons stay in the worker's process group"
    assert argv[argv.index("MASTER_PORT=4321") - 1] == "-x"
    tail = argv[argv.index("rank") - 3 :]
    assert tail == ["/py", "-m", "aicluster.runtime.launchers", "rank", "--", "/bin/sh", "-c", "x"]


def test_the_launcher_field_defaults_to_plain_and_refuses_others_by_name():
    assert load_spec_text("kind: job\nname: a\ncommand: x\n").launcher == "plain"
    assert load_spec_text("kind: job\nname: a\ncommand: x\nlauncher: mpi\n").launcher == "mpi"
    with pytest.raises(SpecError) as err:
        load_spec_text("kind: job\nname: a\ncommand: x\nlauncher: horovod\n")
    assert [i.field for i in err.value.issues] == ["launcher"]
    assert "torchrun" in err.value.issues[0].message


# -- the mpi relay, on real sockets ---------------------------------------------------------


def _agent(g: Gang, secret: str, name: str):
    """An agent's side of the protocol, answering one command with a fixed code."""
    conn = mpirelay._client(g, secret, {"role": "agent", "host": name}, deadline=0)
    msg = conn.recv()
    conn.send(exit=7 if msg.get("run", "").startswith("orted") else 126)
    conn.close()
    return msg


def test_the_relay_hands_an_rsh_command_to_that_nodes_agent_and_returns_its_exit():
    g = gang("mpi", ips=["127.0.0.1"] * 4, port=free_port())
    relay = mpirelay.Relay(g, "sekrit")
    relay.serve()
    try:
        got = {}
        t = threading.Thread(target=lambda: got.update(_agent(g, "sekrit", "aic-node-1")))
        t.start()
        rsh = mpirelay._client(
            g, "sekrit", {"role": "rsh", "host": "aic-node-1", "command": "orted -x"}, deadline=0
        )
        assert rsh.recv() == {"exit": 7}
        t.join(10)
        assert got == {"run": "orted -x"}
    finally:
        relay.close()


def test_the_relay_and_its_clients_refuse_a_wrong_secret():
    g = gang("mpi", ips=["127.0.0.1"] * 4, port=free_port())
    relay = mpirelay.Relay(g, "right")
    relay.serve()
    try:
        with pytest.raises(ConnectionError):
            conn = mpirelay._client(g, "wrong", {"role": "agent", "host": "aic-node-1"}, 0)
            conn.recv()  # the relay closed it: it did not prove the secret
        assert "aic-node-1" not in relay.agents
    finally:
        relay.close()


def test_a_command_the_launcher_cannot_start_is_refused_at_submit_naming_launcher():
    bad = "kind: job\nname: a\nlauncher: torchrun\ncommand: python -c 'print(1)'\n"
    with pytest.raises(SpecError) as err:
        load_spec_text(bad)
    assert [i.field for i in err.value.issues] == ["launcher"]
    assert "torchrun cannot start this command" in err.value.issues[0].message
    assert "'-c'" in err.value.issues[0].message
    ok = "kind: job\nname: a\nlauncher: mpi\ncommand: python -c 'print(1)'\n"
    assert load_spec_text(ok).launcher == "mpi", "mpi runs any command"
