"""CLI output fits the terminal it is on: a wide terminal (or a pipe) shows a whole
reason; a narrow one folds it rather than cutting it; a printed command stays one line."""

from __future__ import annotations

from aicluster.cli import output as out
from aicluster.cli.jobs_cmds import JOB_COLUMNS

REASON = "waiting for capacity in pool gpu: needs 2 x (8 CPU, 64.0 GiB, 8 GPU H100); " + (
    "not enough GPUs: 6 GPUs free on H100 nodes"
)
JOB = {"id": "train-3fa2c1", "name": "train", "team": "ml", "status": "PENDING", "message": REASON}


def test_a_wide_terminal_shows_the_whole_reason(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    out.print_table([JOB], JOB_COLUMNS)
    assert "not enough GPUs: 6 GPUs free on H100 nodes" in capsys.readouterr().out


def test_a_narrow_terminal_folds_the_reason_without_losing_it(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    out.print_table([JOB], JOB_COLUMNS)
    text = capsys.readouterr().out
    assert all(len(line) <= 100 for line in text.splitlines())
    assert "H100 nodes" in text and "…" not in text


def test_a_printed_command_is_never_wrapped(capsys, monkeypatch):
    from aicluster.cli import platform_cmds

    monkeypatch.setenv("COLUMNS", "80")
    line = "aicluster join 10.0.0.1:6379 --ray-token-file <copy of /root/.aicluster/ray/auth_token> --pool p"
    platform_cmds.out.print(f"  add a machine: {line}")
    assert line in capsys.readouterr().out


def test_describe_says_how_long_each_recovery_took_and_its_phases(capsys, monkeypatch):
    from aicluster.cli.jobs_cmds import _attempt_columns

    monkeypatch.setenv("COLUMNS", "200")
    took = {"total_s": 3.4, "detection_s": 2.6, "queue_s": 0.2, "launch_s": 0.6}
    attempts = [
        {"attempt": 1, "placement": ["n1"], "ended_at": 10.0, "end_reason": "node_lost"},
        {"attempt": 2, "placement": ["n2"], "recovery": {"cause": "node_lost", **took}},
    ]
    out.print_table(attempts, _attempt_columns({"n1": "gpu-a", "n2": "gpu-b"}))
    lines = capsys.readouterr().out.splitlines()
    second = next(line for line in lines if "gpu-b" in line)
    assert "3.4 s (detect 2.6, queue 0.2, launch 0.6)" in second and "running" in second
    first = next(line for line in lines if "gpu-a" in line)
    assert "node_lost" in first and "detect" not in first
