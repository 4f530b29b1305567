"""Jobs consume artifacts as read-only inputs and produce new versions as outputs."""

from __future__ import annotations

import pytest

from aicluster.cli import artifacts_sdk
from aicluster.cli.sdk import ApiError

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def test_job_reads_an_input_and_pushes_an_output(admin, tmp_path):
    src = tmp_path / "dataset"
    (src / "sub").mkdir(parents=True)
    (src / "hello.txt").write_text("hello from the dataset\n")
    (src / "sub" / "numbers.csv").write_text("1,2,3\n")
    version = artifacts_sdk.push(admin, src, "default/ja-data", "dataset")
    cmd = (
        'cat "$DATA_DIR/hello.txt"; '
        "stat -c 'mode=%a' data data/hello.txt; "
        "mkdir out && cp data/sub/numbers.csv out/ && echo made-here > out/new.txt"
    )
    spec = {"kind": "job", "name": "ja-consumer", "command": cmd, "workers": 2,
            "inputs": [{"artifact": "default/ja-data:1", "path": "data", "env": "DATA_DIR"}],
            "outputs": [{"path": "out", "artifact": "default/ja-result", "kind": "dataset"}]}  # fmt: skip
    job = admin.submit(spec, None)
    done = admin.wait(job["id"], TERMINAL, timeout=90)
    assert done["status"] == "SUCCEEDED", done
    assert "produced default/ja-result:1" in done["message"]
    for rank in range(2):
        log = admin.logs(job["id"], rank=rank)[0].decode()
        assert "hello from the dataset" in log
        # read-only for everyone but root (who ignores modes: these tests may run as root)
        assert all(m in ("mode=555", "mode=444") for m in log.split() if m.startswith("mode="))
        assert log.count("mode=") == 2
    got, path = artifacts_sdk.pull(admin, "default/ja-result:1", tmp_path / "result")
    assert (path / "numbers.csv").read_text() == "1,2,3\n"
    assert (path / "new.txt").read_text() == "made-here\n"
    assert got["version"] == 1 and version["version"] >= 1


def test_bad_input_or_output_is_refused_at_submit(admin):
    before = len(admin.jobs())
    bad = {"kind": "job", "name": "ja-bad", "command": "true",
           "inputs": [{"artifact": "default/no-such-thing:3", "path": "d"}],
           "outputs": [{"path": "o", "artifact": "other-team/x"}]}  # fmt: skip
    with pytest.raises(ApiError) as exc:
        admin.submit(bad, None)
    assert exc.value.status_code == 422
    fields = {i["field"] for i in exc.value.issues}
    assert fields == {"inputs.0.artifact", "outputs.0.artifact"}
    assert len(admin.jobs()) == before


def test_missing_output_fails_the_job(admin):
    spec = {"kind": "job", "name": "ja-nothing", "command": "true",
            "outputs": [{"path": "never-made", "artifact": "default/ja-none"}]}  # fmt: skip
    job = admin.submit(spec, None)
    done = admin.wait(job["id"], TERMINAL, timeout=60)
    assert done["status"] == "FAILED" and done["reason"] == "output_failed"
    assert "never-made" in done["message"]
