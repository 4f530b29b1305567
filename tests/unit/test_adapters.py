"""Engine adapters (runtime.adapters): command construction for every engine, then the
real server where its binary exists on this machine."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time

import httpx
import pytest

from aicluster.runtime.adapters import CommandStep, HttpStep, build_launch, flags


def test_vllm_command_gpus_and_endpoints():
    plan = build_launch(
        "vllm",
        model="meta-llama/Llama-3.1-8B",
        host="10.0.0.5",
        port=8100,
        gpu_ids=[2, 3],
        served_model_name="llama",
        engine_args={"max_model_len": 4096, "enforce_eager": True, "enable_prefix_caching": False},
        python="/envs/vllm/bin/python",
        memory=16 * 2**30,
    )
    assert plan.argv == (
        "/envs/vllm/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "meta-llama/Llama-3.1-8B",
        "--served-model-name",
        "llama",
        "--host",
        "10.0.0.5",
        "--port",
        "8100",
        "--dtype",
        "auto",
        "--max-model-len",
        "4096",
        "--tensor-parallel-size",
        "2",
        "--enforce-eager",
    )
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert "VLLM_CPU_KVCACHE_SPACE" not in plan.env  # a GPU replica: vLLM sizes its cache
    assert plan.env["HF_HUB_OFFLINE"] == "1"
    assert (plan.health_path, plan.metrics_path, plan.openai_base_path) == (
        "/health",
        "/metrics",
        "/v1",
    )
    assert plan.ready.path == "/v1/models" and plan.ready.contains == "llama"
    assert plan.url(plan.health_path) == "http://10.0.0.5:8100/health"


def test_vllm_on_cpu_is_eager_bfloat16_with_a_kv_cache_from_the_memory_request():
    plan = build_launch(
        "vllm",
        model="/work/model",
        host="127.0.0.1",
        port=9000,
        served_model_name="tiny",
        engine_args={"max_model_len": 512},
        python="/envs/v/bin/python",
        memory=6 * 2**30,
    )
    assert plan.argv == (
        "/envs/v/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/work/model",
        "--served-model-name",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        "9000",
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "512",
        "--enforce-eager",
    )
    assert "--tensor-parallel-size" not in plan.argv
    assert plan.env["CUDA_VISIBLE_DEVICES"] == ""
    assert plan.env["VLLM_CPU_KVCACHE_SPACE"] == "4"  # 6 GiB less the process's own 2 GiB
    assert plan.env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"  # replicas share a node's cores
    assert not plan.checks_secret  # behind the replica's auth proxy


def test_vllm_overrides_dtype_kv_cache_and_eager():
    plan = build_launch(
        "vllm",
        model="m",
        host="h",
        port=1,
        engine_args={
            "dtype": "float32",
            "kv_cache_gib": 3,
            "enforce_eager": False,
            "cpu_threads_bind": "0-1",
        },
    )
    assert plan.argv[plan.argv.index("--dtype") + 1] == "float32"
    assert "--enforce-eager" not in plan.argv and "--kv-cache-gib" not in plan.argv
    assert plan.env["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert plan.env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert "--cpu-threads-bind" not in plan.argv
    small = build_launch("vllm", model="m", host="h", port=1, memory=2**30)
    assert small.env["VLLM_CPU_KVCACHE_SPACE"] == "1"  # never less than 1 GiB
    assert build_launch("vllm", model="m", host="h", port=1).env["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_vllm_tensor_parallel_size_from_engine_args_wins():
    plan = build_launch(
        "vllm",
        model="m",
        host="h",
        port=1,
        gpu_ids=[0, 1, 2, 3],
        engine_args={"tensor_parallel_size": 2},
    )
    i = plan.argv.index("--tensor-parallel-size")
    assert plan.argv[i + 1] == "2" and plan.argv.count("--tensor-parallel-size") == 1


def test_tgi_command():
    plan = build_launch(
        "tgi",
        model="bigscience/bloom-560m",
        host="127.0.0.1",
        port=3000,
        gpu_ids=[0],
        engine_args={"max_input_tokens": 1024},
    )
    assert plan.argv == (
        "text-generation-launcher",
        "--model-id",
        "bigscience/bloom-560m",
        "--hostname",
        "127.0.0.1",
        "--port",
        "3000",
        "--num-shard",
        "1",
        "--max-input-tokens",
        "1024",
    )
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "0"
    assert plan.health_path == "/health" and plan.metrics_path == "/metrics"


def test_ollama_serves_on_env_address_then_pulls_and_loads_the_model():
    plan = build_launch(
        "ollama",
        model="llama3.2:1b",
        host="127.0.0.1",
        port=11500,
        gpu_ids=[1],
        engine_args={"models_dir": "/cache/ollama"},
    )
    assert plan.argv == ("ollama", "serve")
    assert plan.env["OLLAMA_HOST"] == "127.0.0.1:11500"
    assert plan.env["OLLAMA_MODELS"] == "/cache/ollama"
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "1"
    pull, load = plan.after_start
    assert isinstance(pull, CommandStep) and pull.argv == ("ollama", "pull", "llama3.2:1b")
    assert pull.env["OLLAMA_HOST"] == "127.0.0.1:11500"
    assert isinstance(load, HttpStep) and load.json == {"model": "llama3.2:1b", "keep_alive": -1}
    assert plan.metrics_path is None and plan.ready.contains == "llama3.2:1b"


def test_python_engines_use_the_given_interpreter():
    sim = build_launch(
        "simulated",
        model="sim",
        host="127.0.0.1",
        port=9000,
        python="/venv/bin/python",
        engine_args={"block_size": 8},
    )
    assert sim.argv == (
        "/venv/bin/python",
        "-m",
        "aicluster.runtime.simulated_engine",
        "--host",
        "127.0.0.1",
        "--port",
        "9000",
        "--model",
        "sim",
        "--block-size",
        "8",
    )
    assert sim.env["CUDA_VISIBLE_DEVICES"] == ""  # a CPU replica sees no GPU
    builtin = build_launch(
        "builtin",
        model="/artifacts/charlm",
        host="h",
        port=9,
        served_model_name="charlm",
        gpu_ids=[0],
    )
    assert builtin.argv[2] == "aicluster.runtime.builtin_server"
    assert builtin.argv[-4:] == ("--model", "/artifacts/charlm", "--served-model-name", "charlm")


def test_base_env_is_kept_and_gpu_visibility_overrides_it():
    plan = build_launch(
        "vllm",
        model="m",
        host="h",
        port=1,
        gpu_ids=[5],
        base_env={"HF_HOME": "/cache", "CUDA_VISIBLE_DEVICES": "0,1,2"},
    )
    assert plan.env["HF_HOME"] == "/cache" and plan.env["CUDA_VISIBLE_DEVICES"] == "5"
    tgi = build_launch("tgi", model="m", host="h", port=1, base_env={"HF_HOME": "/c"})
    assert tgi.env == {"HF_HOME": "/c", "CUDA_VISIBLE_DEVICES": ""}


def test_flags_and_errors():
    assert flags({"a_b": 1, "c": True, "d": False, "e": None, "--raw-flag": "x"}) == [
        "--a-b",
        "1",
        "--c",
        "--raw-flag",
        "x",
    ]
    with pytest.raises(ValueError, match="unknown engine 'triton'"):
        build_launch("triton", model="m", host="h", port=1)
    with pytest.raises(ValueError, match="port"):
        build_launch("vllm", model="m", host="h", port=0)


# -- real binaries -----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, deadline_s: float = 30.0) -> httpx.Response:
    """Poll until the server answers (a condition, bounded by a deadline)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        assert proc.poll() is None, f"server exited with {proc.returncode}"
        try:
            return httpx.get(url, timeout=2.0)
        except httpx.TransportError:
            time.sleep(0.05)
    raise AssertionError(f"{url} did not answer within {deadline_s} s")


def test_simulated_engine_runs_from_its_launch_plan():
    plan = build_launch(
        "simulated",
        model="sim",
        host="127.0.0.1",
        port=free_port(),
        python=sys.executable,
        engine_args={"time_scale": 0.01},
    )
    proc = subprocess.Popen(
        plan.argv,
        env=os.environ | dict(plan.env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert wait_http(plan.url(plan.health_path), proc).status_code == 200
        ready = httpx.get(plan.url(plan.ready.path))
        assert ready.status_code == plan.ready.status and plan.ready.contains in ready.text
        assert "vllm:num_requests_running" in httpx.get(plan.url(plan.metrics_path)).text
        r = httpx.post(
            plan.url(plan.openai_base_path + "/completions"),
            json={"model": "sim", "prompt": "hi", "max_tokens": 2},
        )
        assert r.status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# vLLM runs for real from an engine env in tests/integration/test_vllm_engine.py.
BINARIES = {
    "tgi": ("text-generation-launcher", "--num-shard"),
    "ollama": ("ollama", None),
}


@pytest.mark.parametrize("engine", sorted(BINARIES))
def test_real_engine_binary(engine):
    binary, flag = BINARIES[engine]
    if shutil.which(binary) is None:
        pytest.skip(f"`{binary}` is not installed on this machine (not on PATH)")
    plan = build_launch(
        engine,
        model=os.environ.get(f"AICLUSTER_TEST_{engine.upper()}_MODEL", "unset"),
        host="127.0.0.1",
        port=free_port(),
    )
    if engine == "ollama":  # serving needs no model: start it and probe its health path
        proc = subprocess.Popen(
            plan.argv,
            env=os.environ | dict(plan.env),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            assert wait_http(plan.url(plan.health_path), proc).status_code == 200
        finally:
            proc.terminate()
            proc.wait(timeout=10)
        return
    # the flags we build must be ones the installed binary knows
    help_argv = [binary, "--help"]
    out = subprocess.run(help_argv, capture_output=True, text=True, timeout=120, check=False)
    assert flag in out.stdout + out.stderr
