"""Jobs' environments: the spec (pip, a requirements file, a Python version), the runner
activating the env for a job, the cache's size limit (least recently used out, never one
in use) and pip's progress. Real venvs and real pip over hand-made wheels (no index)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from pydantic import ValidationError
from wheels import make_wheel

from aicluster.runtime import envcache, envs
from aicluster.specs.environment import read_requirements
from aicluster.specs.job import JobSpec


def job(**environment) -> JobSpec:
    return JobSpec(name="j", command="python train.py", environment=environment)


def test_a_job_environment_needs_something_to_install_and_no_pip_options():
    assert job(pip=["numpy==2.1.0"], python="3.11").environment.python == "3.11"
    assert job(requirements="requirements.txt").environment.pip == []
    for bad, field in (
        ({}, "environment"),
        ({"pip": ["--index-url=http://evil"]}, "pip"),
        ({"pip": ["x"], "python": "2.7"}, "python"),
        ({"pip": ["x"], "image": "ubuntu"}, "image"),
    ):
        with pytest.raises(ValidationError) as err:
            job(**bad)
        assert field in str(err.value)


def test_a_requirements_file_gives_its_lines_and_names_a_line_it_cannot_carry(tmp_path):
    req = tmp_path / "requirements.txt"
    req.write_text("# pinned\nnumpy==2.1.0  # for arrays\n\nwheels/x-1.0-py3-none-any.whl\n")
    assert read_requirements(req) == ["numpy==2.1.0", "wheels/x-1.0-py3-none-any.whl"]
    req.write_text("numpy\n-r other.txt\n")
    with pytest.raises(ValueError, match="line 2: -r is a pip option"):
        read_requirements(req)
    with pytest.raises(ValueError, match="cannot read"):
        read_requirements(tmp_path / "missing.txt")


def test_a_python_version_picks_the_interpreter_or_says_it_is_missing():
    here = ".".join(map(str, sys.version_info[:2]))
    spec = {"pip": ["x"]}
    assert envs.interpreter_for({**spec, "python": here}) == envs.base_python()
    # asking for the version the node runs anyway is the same env as not asking
    assert envs.env_key({**spec, "python": here}) == envs.env_key(spec)
    with pytest.raises(envs.EnvBuildError, match="python 3.99 is not on this node"):
        envs.interpreter_for({**spec, "python": "3.99"})


def test_pip_progress_says_packages_collected_then_installed():
    lines: list[str] = []
    progress = envs._PipProgress("k", lines.append, every_s=0)
    for line in ("Collecting a", "Collecting b", "Installing collected packages: a, b"):
        progress(line)
    said = [envs.last_progress(x) for x in lines if x.startswith(envs.PROGRESS_PREFIX)]
    assert said == [
        "building env k: 1 packages collected",
        "building env k: 2 packages collected",
        "building env k: installing 2 packages",
    ]


def _fake_env(folder, name: str, size: int, used_ago: float):
    env = folder / name
    env.mkdir(parents=True)
    (env / envs.MARKER).write_text(json.dumps({"bytes": size}))
    stamp = env / envcache.USED_STAMP
    stamp.touch()
    t = time.time() - used_ago
    os.utime(stamp, (t, t))
    return env


HOLD = (
    "import sys; from pathlib import Path; from aicluster.runtime import envcache; "
    "envcache.hold_in_use(Path(sys.argv[1])); print('held', flush=True); sys.stdin.read()"
)


def test_the_cache_evicts_the_least_recently_used_envs_but_never_one_in_use(tmp_path):
    folder = tmp_path / "uid-0"
    oldest = _fake_env(folder, "a", 400, used_ago=300)
    in_use = _fake_env(folder, "b", 400, used_ago=200)
    newer = _fake_env(folder, "c", 400, used_ago=100)
    newest = _fake_env(folder, "d", 400, used_ago=0)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(in_use)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        removed = envcache.evict(folder, envs.MARKER, limit=900, keep=newest)
        assert removed == [oldest, newer]  # b is skipped: a workload holds it
        assert in_use.exists() and newest.exists() and not oldest.exists()
    finally:
        holder.stdin.close()
        holder.wait(10)
    assert envcache.evict(folder, envs.MARKER, limit=0, keep=newest) == [in_use]
    assert [p.name for p in folder.iterdir() if not p.name.endswith(".inuse")] == ["d"]


def test_the_runner_runs_a_job_as_in_its_activated_env_and_holds_it_in_use(tmp_path):
    wheel = make_wheel(tmp_path, "aicjobpkg")
    spec = {"pip": [str(wheel)]}
    code = (
        "import aicjobpkg, shutil, sys, time; print('prefix', sys.prefix); "
        "print('pip', shutil.which('pip')); print('value', aicjobpkg.VALUE, flush=True); "
        "sys.stdin.read()"
    )
    extra = {**envs.job_env(spec), envs.ROOT_ENV: str(tmp_path / "root")}
    proc = subprocess.Popen(
        [*envs.runner(["python", "-c", code])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **extra, "PATH": "/usr/bin:/bin"},
    )
    out = []
    while not (line := proc.stdout.readline()).startswith("value"):
        assert line, "".join(out)
        out.append(line)
    env_path = envs.user_dir(tmp_path / "root") / envs.env_key(spec)
    assert f"prefix {env_path}\n" in out and f"pip {env_path / 'bin' / 'pip'}\n" in out
    assert line.strip() == "value 1.0"
    try:  # while the job runs its env cannot be evicted, whatever the limit
        assert envcache.evict(env_path.parent, envs.MARKER, limit=0) == []
    finally:
        proc.stdin.close()
        proc.wait(30)
    assert proc.returncode == 0
    assert (env_path / envcache.USED_STAMP).exists()
    assert envcache.evict(env_path.parent, envs.MARKER, limit=0) == [env_path]


def test_an_image_is_refused_with_what_to_do_instead():
    from aicluster.specs.errors import SpecError
    from aicluster.specs.loader import load_spec_text

    with pytest.raises(SpecError) as err:
        load_spec_text("kind: job\nname: a\ncommand: x\nimage: ubuntu:22.04\n")
    text = str(err.value)
    assert "line 4: image: container images are not run" in text and "environment" in text
