"""Engine adapters: how to start each inference engine as one replica, and how to probe it.

Vocabulary:
- LaunchPlan: everything a replica launcher needs, as data: the server's argv and the
  environment to add, where to probe it (`health_path`: the process is up;
  `ready`: it can serve the model), the OpenAI base path the gateway proxies to, the
  Prometheus metrics path (None when the engine has none), and `after_start` steps to run
  once healthy and before the ready check (Ollama: pull the model, then load it).
- engine_args: the service spec's `engine_args`, turned into flags: `{"max_model_len":
  4096}` -> `--max-model-len 4096`; `True` -> a bare flag; `False` and None -> omitted.
  Keys that already start with `-` are kept as written.
- builtin: `python -m aicluster.runtime.builtin_server --host H --port P --model MODEL
  --served-model-name NAME [flags]` (the module is built separately; this is its contract).
- checks_secret: the engine's server checks the replica secret itself (builtin,
  simulated: runtime.replica_auth); the others are put behind the auth proxy by
  runtime.replica_main, listening on a private port on 127.0.0.1.
- python: the interpreter of the engine's own env (runtime.envs) for engines that are
  Python modules (vllm, builtin, simulated).
- gpu_ids: the GPUs this replica was granted. CUDA_VISIBLE_DEVICES is always set, to the
  empty string when there are none, so a CPU replica never grabs a GPU.

Invariants: pure (no processes, no I/O, no environment reads — the Python interpreter and
the base environment are passed in); every plan listens on exactly `host:port`.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

EngineArgs = Mapping[str, str | int | float | bool | None]
ENGINES = ("builtin", "simulated", "vllm", "tgi", "ollama")
BUILTIN_MODULE = "aicluster.runtime.builtin_server"
SIMULATED_MODULE = "aicluster.runtime.simulated_engine"


@dataclass(frozen=True)
class ReadyCheck:
    """GET `path` answers `status`, and its body contains `contains` when that is set."""

    path: str
    status: int = 200
    contains: str | None = None


@dataclass(frozen=True)
class CommandStep:
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 3600.0


@dataclass(frozen=True)
class HttpStep:
    method: str
    path: str
    json: Mapping[str, object] = field(default_factory=dict)
    timeout_s: float = 600.0


@dataclass(frozen=True)
class LaunchPlan:
    engine: str
    model: str
    served_model_name: str
    host: str
    port: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    health_path: str
    ready: ReadyCheck
    openai_base_path: str = "/v1"
    metrics_path: str | None = "/metrics"
    after_start: tuple[CommandStep | HttpStep, ...] = ()
    checks_secret: bool = False

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url(self, path: str) -> str:
        return self.base_url + path

    def shell(self) -> str:
        """The command line, for logs and `describe`."""
        return shlex.join(self.argv)


@dataclass(frozen=True)
class LaunchRequest:
    engine: str
    model: str
    host: str
    port: int
    gpu_ids: tuple[int, ...] = ()
    engine_args: EngineArgs = field(default_factory=dict)
    served_model_name: str | None = None
    python: str = "python3"
    base_env: Mapping[str, str] = field(default_factory=dict)
    memory: int = 0  # the replica's memory request, bytes (0: none given)

    @property
    def name(self) -> str:
        return self.served_model_name or self.model


def flags(engine_args: EngineArgs) -> list[str]:
    out: list[str] = []
    for key, value in engine_args.items():
        flag = key if key.startswith("-") else "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is not False and value is not None:
            out += [flag, str(value)]
    return out


def _env(req: LaunchRequest, **extra: str) -> dict[str, str]:
    env = dict(req.base_env)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in req.gpu_ids)
    env.update(extra)
    return env


def _plan(req: LaunchRequest, engine: str, argv, ready: ReadyCheck, **extra) -> LaunchPlan:
    """The fields every engine's plan shares; `extra` overrides or adds the rest."""
    fields = dict(
        engine=engine,
        model=req.model,
        served_model_name=req.name,
        host=req.host,
        port=req.port,
        argv=tuple(argv),
        env=_env(req),
        health_path="/health",
        ready=ready,
    )
    fields.update(extra)
    return LaunchPlan(**fields)


VLLM_MODULE = "vllm.entrypoints.openai.api_server"
GiB = 1 << 30
# What a vLLM process holds besides its KV cache on CPU (interpreter, torch, the weights of
# a small model); a replica's memory request beyond this goes to the KV cache.
VLLM_CPU_BASE_BYTES = 2 * GiB
# No hub, no telemetry: a replica serves what it was given, on a machine that may be offline.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "PYTHONUNBUFFERED": "1",
}


def vllm_kv_cache_gib(memory_bytes: int) -> int:
    """VLLM_CPU_KVCACHE_SPACE (whole GiB, at least 1) for a CPU replica's memory request."""
    if memory_bytes <= 0:
        return 1
    return max(1, int((memory_bytes - VLLM_CPU_BASE_BYTES) // GiB))


def _vllm(req: LaunchRequest) -> LaunchPlan:
    """vLLM's OpenAI server, started as a module of the engine env's interpreter (the
    `vllm` console script of the vllm-cpu distribution fails at start). On GPUs:
    tensor parallel over the granted GPUs; on CPU: bfloat16, eager mode (no warm-up
    compile), a KV cache sized from the replica's memory request and no pinning of threads
    to cores (`cpu_threads_bind` in engine_args: vLLM's VLLM_CPU_OMP_THREADS_BIND)."""
    args = dict(req.engine_args)
    gpu = bool(req.gpu_ids)
    tp = args.pop("tensor_parallel_size", None) or max(1, len(req.gpu_ids))
    dtype = args.pop("dtype", None) or ("auto" if gpu else "bfloat16")
    kv_gib = args.pop("kv_cache_gib", None)
    if gpu:
        args.pop("cpu_threads_bind", None)
    extra: dict[str, str] = dict(OFFLINE_ENV)
    argv = [
        req.python,
        "-m",
        VLLM_MODULE,
        "--model",
        req.model,
        "--served-model-name",
        req.name,
        "--host",
        req.host,
        "--port",
        str(req.port),
        "--dtype",
        str(dtype),
    ]
    if "max_model_len" in args:
        argv += ["--max-model-len", str(args.pop("max_model_len"))]
    if gpu:
        argv += ["--tensor-parallel-size", str(tp)]
    else:
        extra["VLLM_CPU_KVCACHE_SPACE"] = str(kv_gib or vllm_kv_cache_gib(req.memory))
        # vLLM's "auto" binding pins every replica of a node to the same cores (it cannot
        # know its neighbours): leave placement to the OS, threads to OMP_NUM_THREADS.
        extra["VLLM_CPU_OMP_THREADS_BIND"] = str(args.pop("cpu_threads_bind", None) or "nobind")
        if "enforce_eager" not in args:
            argv.append("--enforce-eager")
    argv += flags(args)
    return _plan(
        req,
        "vllm",
        argv,
        ReadyCheck("/v1/models", contains=req.name),
        env=_env(req, **extra),
    )


def _tgi(req: LaunchRequest) -> LaunchPlan:
    args = dict(req.engine_args)
    shards = args.pop("num_shard", None) or max(1, len(req.gpu_ids))
    argv = [
        "text-generation-launcher",
        "--model-id",
        req.model,
        "--hostname",
        req.host,
        "--port",
        str(req.port),
        "--num-shard",
        str(shards),
        *flags(args),
    ]
    return _plan(req, "tgi", argv, ReadyCheck("/health"))


def _ollama(req: LaunchRequest) -> LaunchPlan:
    address = f"{req.host}:{req.port}"
    extra = {"OLLAMA_HOST": address}
    if "models_dir" in req.engine_args:
        extra["OLLAMA_MODELS"] = str(req.engine_args["models_dir"])
    env = _env(req, **extra)
    client_env = {"OLLAMA_HOST": address}
    steps: tuple[CommandStep | HttpStep, ...] = (
        CommandStep(("ollama", "pull", req.model), env=client_env),
        HttpStep("POST", "/api/generate", {"model": req.model, "keep_alive": -1}),
    )
    return LaunchPlan(
        engine="ollama",
        model=req.model,
        served_model_name=req.model,
        host=req.host,
        port=req.port,
        argv=("ollama", "serve"),
        env=env,
        health_path="/api/version",
        ready=ReadyCheck("/api/ps", contains=req.model),
        metrics_path=None,
        after_start=steps,
    )


def _python_module(engine: str, module: str) -> Callable[[LaunchRequest], LaunchPlan]:
    def build(req: LaunchRequest) -> LaunchPlan:
        argv = [req.python, "-m", module, "--host", req.host, "--port", str(req.port)]
        if engine == "builtin":  # the model to load, and the name to answer to
            argv += ["--model", req.model, "--served-model-name", req.name]
        else:  # the simulator loads nothing: its model is only a name
            argv += ["--model", req.name]
        argv += flags(req.engine_args)
        return _plan(
            req,
            engine,
            argv,
            ReadyCheck("/v1/models", contains=req.name),
            env=_env(req, PYTHONUNBUFFERED="1"),
            checks_secret=True,
        )

    return build


ADAPTERS: Mapping[str, Callable[[LaunchRequest], LaunchPlan]] = MappingProxyType(
    {
        "vllm": _vllm,
        "tgi": _tgi,
        "ollama": _ollama,
        "simulated": _python_module("simulated", SIMULATED_MODULE),
        "builtin": _python_module("builtin", BUILTIN_MODULE),
    }
)


def build_launch(
    engine: str,
    *,
    model: str,
    host: str,
    port: int,
    gpu_ids: Sequence[int] = (),
    engine_args: EngineArgs | None = None,
    served_model_name: str | None = None,
    python: str = "python3",
    base_env: Mapping[str, str] | None = None,
    memory: int = 0,
) -> LaunchPlan:
    """The launch plan of one replica of `engine` serving `model` on `host:port`."""
    adapter = ADAPTERS.get(engine)
    if adapter is None:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ADAPTERS)}")
    if not 0 < port < 65536:
        raise ValueError(f"port must be in 1..65535, got {port}")
    return adapter(
        LaunchRequest(
            engine=engine,
            model=model,
            host=host,
            port=port,
            gpu_ids=tuple(gpu_ids),
            engine_args=dict(engine_args or {}),
            served_model_name=served_model_name,
            python=python,
            base_env=dict(base_env or {}),
            memory=int(memory),
        )
    )
