"""The sandbox's pure parts: the environment allow-list and the bubblewrap mounts."""

from __future__ import annotations

import sys
from pathlib import Path

from aicluster.runtime.sandbox import SandboxPolicy, bwrap_prefix, workload_env, wrap

OPERATOR = {
    "AWS_ACCESS_KEY_ID": "AKIA-op",
    "AWS_SECRET_ACCESS_KEY": "op-secret",
    "RAY_AUTH_TOKEN_PATH": "/x",
    "AICLUSTER_HOME": "/root/.aicluster",
    "GOOGLE_APPLICATION_CREDENTIALS": "/k.json",
    "HOME": "/root",
    "PATH": "/root/.pyenv/shims:/usr/bin",
    "LANG": "C.UTF-8",
    "NCCL_SOCKET_IFNAME": "eth0",
    "LC_ALL": "C",
    "SSH_AUTH_SOCK": "/tmp/ssh",
}


def test_the_environment_is_an_allow_list(tmp_path):
    env = workload_env({"MY_FLAG": "1", "RANK": "0"}, tmp_path / "workdir", 50001, OPERATOR)
    assert not {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "RAY_AUTH_TOKEN_PATH",
        "AICLUSTER_HOME",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "SSH_AUTH_SOCK",
    } & set(env)
    assert env["LANG"] == "C.UTF-8" and env["LC_ALL"] == "C" and env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert env["MY_FLAG"] == "1" and env["RANK"] == "0"
    assert env["HOME"] == str(tmp_path / "home") and env["TMPDIR"] == str(tmp_path / "tmp")
    assert "/root" not in env["PATH"].split(":")[1:]
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)


def test_the_jobs_own_env_wins(tmp_path):
    env = workload_env({"LANG": "de_DE.UTF-8", "HOME": "/data/me"}, tmp_path / "w", 50001, OPERATOR)
    assert env["LANG"] == "de_DE.UTF-8" and env["HOME"] == "/data/me"


def test_mounts_hide_the_platform_and_bind_the_job_last(tmp_path):
    hidden, shared, job = tmp_path / "home", tmp_path / "shared", tmp_path / "work" / "j-a1-r0"
    for p in (hidden, shared, job / "workdir"):
        p.mkdir(parents=True)
    policy = SandboxPolicy(50001, 50001, hidden=(str(hidden),), shared=(str(shared),))
    argv = bwrap_prefix(policy, job)
    assert argv[0] == "bwrap" and argv[4:6] == ["--tmpfs", "/tmp"]
    joined = " ".join(argv)
    assert f"--bind {job} {job}" in joined and f"--bind {shared} {shared}" in joined
    assert joined.index(f"--bind {job}") > joined.index("--tmpfs /tmp")
    # the folders above the job's own are traversable, not 0700 as bwrap would make them
    assert f"--perms 0711 --dir {job.parent}" in joined
    setpriv = argv.index("setpriv")
    assert argv[setpriv + 1 : setpriv + 3] == ["--reuid=50001", "--regid=50001"]
    assert "--no-new-privs" in argv and "--clear-groups" in argv and argv[-1] == "--"


def test_a_shell_command_runs_under_sh_inside_the_sandbox():
    assert wrap(["bwrap", "--"], "echo $RANK") == ["bwrap", "--", "/bin/sh", "-c", "echo $RANK"]
    assert wrap(["bwrap", "--"], ["python", "x.py"]) == ["bwrap", "--", "python", "x.py"]
    assert wrap([], "echo hi") == "echo hi"
