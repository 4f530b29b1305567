"""The control plane's collector thresholds: set by its entry point, never by an import."""

from __future__ import annotations

import gc
import subprocess
import sys

from aicluster.control.gc_settings import CONTROL_PLANE_THRESHOLDS, tune_for_control_plane


def test_tuning_sets_the_thresholds_and_returns_the_ones_it_replaced():
    before = gc.get_threshold()
    try:
        assert tune_for_control_plane() == before
        assert gc.get_threshold() == CONTROL_PLANE_THRESHOLDS
        assert CONTROL_PLANE_THRESHOLDS[0] > 700  # fewer collections inside a tick
    finally:
        gc.set_threshold(*before)


def test_importing_the_server_leaves_the_process_collector_alone():
    code = (
        "import gc; before = gc.get_threshold(); import aicluster.api.server; "
        "import aicluster.control.gc_settings; assert gc.get_threshold() == before, gc.get_threshold()"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
