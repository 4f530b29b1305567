"""A takeover's look fences a launch even where the dead leader had not made the rank's
worker yet (engine.ray_engine `status(fence=True)`, engine.worker_actor): the worker made
afterwards, on a real Ray cluster, refuses to run its command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROBE = Path(__file__).parent.parent / "fence_probe.py"


def test_a_worker_made_after_its_attempt_was_fenced_never_runs_its_command(ray_cluster, tmp_path):
    cluster, _ = ray_cluster
    tmp_path.chmod(0o777)
    done = subprocess.run(
        [sys.executable, str(PROBE), cluster.address, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["look"] == [{"started": False, "lost": True}]  # nothing there yet
    assert result["fenced"]["refused"] == "Fenced", result
    assert "fenced by a takeover" in result["fenced"]["why"] and not result["fenced"]["ran"]
    assert result["free"] == {"started": True, "ran": True}, result
    assert result["fence_kept"] and not result["old_kept"]  # a day-old fence is swept
