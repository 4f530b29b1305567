"""A sandboxed workload, and everything it started, dies with the worker that started it
(runtime.sandbox: a PID namespace of its own whose init is bubblewrap). A parent-death
signal alone did not do it: bubblewrap runs without CAP_KILL, so its death could not
signal a process of the workload's user, and replicas outlived their workers. Real
bubblewrap and setpriv; the worker killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from aicluster.runtime.sandbox import node_can_sandbox

from harness import marked_processes, wait_for

pytestmark = pytest.mark.skipif(
    not node_can_sandbox(), reason="sandboxing needs root, bubblewrap and setpriv on this machine"
)

# What a worker does (runtime.worker): start the workload in the sandbox, asked to die
# with it.
WORKER = textwrap.dedent(
    """
    import ctypes, signal, subprocess, sys, time
    from pathlib import Path
    from aicluster.runtime.sandbox import SandboxPolicy, prepare, wrap

    def die_with_parent():
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    job = Path(sys.argv[1])
    (job / "workdir").mkdir(parents=True, exist_ok=True)
    prefix = prepare(SandboxPolicy(50077, 50077), job).prefix
    subprocess.Popen(wrap(prefix, sys.argv[2]), preexec_fn=die_with_parent)
    time.sleep(600)
    """
)


def _marked(mark: str) -> dict[int, int]:
    """pid -> uid of the live processes whose command line has `mark`, but the worker's and
    bubblewrap's (their argv names the command)."""
    out = {}
    for pid in marked_processes(mark):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            uid = os.stat(f"/proc/{pid}").st_uid
        except FileNotFoundError:
            continue
        if b"bwrap" not in cmdline and b"runtime.sandbox" not in cmdline:
            out[pid] = uid
    return out


def test_a_killed_worker_takes_the_workload_and_all_it_started_with_it(tmp_path):
    mark = f"orphan-{uuid.uuid4().hex[:8]}"
    # the workload (a shell, as a job's command runs) starts a child of its own that
    # nobody asks to die with its parent, as an engine under replica_main or a job's
    # training script under its shell
    sleeper = f"{sys.executable} -c 'import time; time.sleep(600)' {mark}"
    command = f"{sleeper} & {sleeper}"
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path / "j-r0"), command])
    try:
        # the shell and its two sleepers (or the second one in the shell's place)
        wait_for(lambda: len(_marked(mark)) >= 2, timeout=30, what="the sandboxed processes")
        assert set(_marked(mark).values()) == {50077}  # they run as the workload user
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
        wait_for(lambda: not _marked(mark), timeout=10, what="the workload gone with its worker")
    finally:
        if worker.poll() is None:
            worker.kill()
        for pid in _marked(mark):
            os.kill(pid, signal.SIGKILL)


def test_the_workload_sees_only_its_own_processes(tmp_path):
    job = tmp_path / "j-r1"
    command = "ls /proc | grep -c '^[0-9]' > seen"
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(job), command])
    try:
        seen = job / "workdir" / "seen"
        wait_for(lambda: seen.exists() and seen.read_text().strip(), timeout=30, what="ls")
        assert int(seen.read_text()) <= 4  # bubblewrap, the shell, ls, grep: not the node's
    finally:
        worker.kill()
        worker.wait(timeout=10)
