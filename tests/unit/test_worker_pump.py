"""The worker's output pump (runtime.worker): the command writes to a pipe, and each
chunk goes to the log file first, then to `on_output` with its absolute offset."""

from __future__ import annotations

import threading
import time

from aicluster.runtime.worker import WorkerProcess


def _wait_exit(worker: WorkerProcess, timeout: float = 10.0) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = worker.status(0)
        if st["exit_code"] is not None:
            return st
        time.sleep(0.02)
    raise TimeoutError("command did not exit")


def test_chunks_reach_the_file_and_the_callback_with_their_offsets(tmp_path):
    seen: list[tuple[int, bytes]] = []
    lock = threading.Lock()

    def on_output(offset: int, chunk: bytes) -> None:
        with lock:
            seen.append((offset, chunk))

    w = WorkerProcess("job", 1, 0, scratch_root=str(tmp_path), on_output=on_output)
    w.start("echo a; sleep 0.2; echo b >&2", {}, None)
    st = _wait_exit(w)
    # The exit is reported only once the pump drained the pipe: the log is whole.
    assert st["exit_code"] == 0 and st["log"] == b"a\nb\n"
    assert w.log_path.read_bytes() == b"a\nb\n"
    assert seen == [(0, b"a\n"), (2, b"b\n")]
    assert w.stop() == 0
    assert not w.dir.exists()


def test_a_failing_callback_does_not_stop_the_log(tmp_path):
    def on_output(offset: int, chunk: bytes) -> None:
        raise RuntimeError("sink is down")

    w = WorkerProcess("job", 1, 0, scratch_root=str(tmp_path), on_output=on_output)
    w.start("for i in 1 2 3; do echo line$i; sleep 0.05; done", {}, None)
    assert _wait_exit(w)["log"] == b"line1\nline2\nline3\n"
    w.stop()


def test_large_output_arrives_whole_and_in_order(tmp_path):
    chunks: list[tuple[int, bytes]] = []
    w = WorkerProcess(
        "job", 1, 0, scratch_root=str(tmp_path), on_output=lambda o, c: chunks.append((o, c))
    )
    w.start(["python3", "-c", "import sys; sys.stdout.write('x' * 300000 + 'end')"], {}, None)
    _wait_exit(w)
    data = w.log_path.read_bytes()
    assert len(data) == 300003 and data.endswith(b"end")
    offset = 0
    for o, c in chunks:
        assert o == offset and len(c) <= 64 * 1024
        offset += len(c)
    assert b"".join(c for _, c in chunks) == data
    w.stop()


def test_stop_does_not_wait_on_a_daemon_holding_the_pipe(tmp_path):
    w = WorkerProcess("job", 1, 0, scratch_root=str(tmp_path))
    # setsid puts the daemon outside the command's process group, so stop cannot kill it,
    # and it keeps the pipe's write end open: the pump never sees EOF.
    w.start("echo started; setsid sleep 8 & echo bye", {}, None)
    t0 = time.time()
    assert w.stop(grace=1) is not None
    assert time.time() - t0 < 5


def test_a_command_that_cannot_start_says_so_in_its_log(tmp_path):
    seen = []
    w = WorkerProcess(
        "job", 1, 0, scratch_root=str(tmp_path), on_output=lambda o, c: seen.append((o, c))
    )
    try:
        w.start(["/nonexistent/binary"], {}, None)
    except OSError:
        pass
    else:
        raise AssertionError("start should raise")
    assert w.log_path.read_bytes().startswith(b"aicluster: cannot start command:")
    assert seen == [(0, w.log_path.read_bytes())]


def test_rapid_lines_travel_in_few_chunks(tmp_path):
    seen: list[tuple[int, bytes]] = []
    w = WorkerProcess(
        "job", 1, 0, scratch_root=str(tmp_path), on_output=lambda o, c: seen.append((o, c))
    )
    w.start("for i in $(seq 1 300); do echo line$i; done", {}, None)
    _wait_exit(w)
    expected = "".join(f"line{i}\n" for i in range(1, 301)).encode()
    assert b"".join(c for _, c in seen) == expected == w.log_path.read_bytes()
    assert len(seen) < 100, "each write of the command is not its own push"
    w.stop()
