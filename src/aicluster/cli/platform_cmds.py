"""`aicluster up | down | join`: the processes of one machine.

Files under AICLUSTER_HOME: platform.json (what `up`/`join` started),
controlplane.json (pid and URL of the control plane; controlplane-PORT.json and
controlplane-PORT.log for a further replica, `up --join-control-plane`), gateway.json and
gateway.log (the gateway process, cli.gateway_cmds), client.json (the API URL for
the CLI), admin.token (0600), machine-id (0600: this machine's stable node identity,
kept across rejoins), state.db (or state.json: the database `up --state` was given), logs/.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
from pathlib import Path
from typing import Annotated

import httpx
import psutil
import typer
from rich.console import Console

from aicluster.cli.config import home_dir
from aicluster.cli.daemons import start_and_wait
from aicluster.cli.gateway_cmds import running_gateway, start_gateway, stop_gateway
from aicluster.cli.state_cmds import STATE_ENV, check_reachable, remember_state, state_location
from aicluster.engine.rayenv import ray_env, ray_token_path

# soft_wrap: a printed command (`aicluster join ...`) stays one line that can be pasted,
# whatever the terminal's width or a pipe's.
err = Console(stderr=True, soft_wrap=True)
out = Console(soft_wrap=True)


_LABEL_KEY = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._/-]{0,251}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")


def _node_labels(pool: str, labels: list[str] | None) -> dict[str, str]:
    """`--pool` and `--label key=value` checked: a pool is a name (spec.names); label keys and
    values are short, printable and safe in a Ray label, a metric and a log line."""
    from aicluster.engine.protocol import POOL_LABEL
    from aicluster.specs.names import check_name

    try:
        check_name(pool, "--pool")
    except ValueError as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    result = {POOL_LABEL: pool}
    for item in labels or []:
        key, sep, value = item.partition("=")
        if not sep or not _LABEL_KEY.fullmatch(key) or not _LABEL_VALUE.fullmatch(value):
            err.print(
                f"[red]--label must look like key=value (letters, digits, '.', '_', '-'; "
                f"a value of at most 63), got {item[:80]!r}[/red]"
            )
            raise typer.Exit(2)
        result[key] = value
    return result


def _machine_id(home: Path) -> str:
    """This machine's stable id, AICLUSTER_HOME/machine-id (0600), written at the first
    `up` or `join` and kept: every Ray node this installation starts carries it
    (MACHINE_LABEL), so a machine that rejoins is the same node again."""
    import uuid

    path = home / "machine-id"
    try:
        known = path.read_text().strip()
    except OSError:
        known = ""
    if _LABEL_VALUE.fullmatch(known):
        return known
    machine_id = uuid.uuid4().hex
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(machine_id + "\n")
    tmp.replace(path)
    return machine_id


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _pid_alive(pid: int | None) -> bool:
    return bool(pid) and psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"


def _start_control_plane(
    home: Path,
    ray_address: str,
    host: str,
    port: int,
    policy: str = "fair",
    shared: list[str] = (),
    retire_down_after: float = 600.0,
    log_format: str = "text",
    state: str | None = None,
    replica: bool = False,
) -> str:
    url = f"http://{host}:{port}"
    env = dict(os.environ)
    env.update(ray_env(home, ray_address.startswith("127.")))
    if state is not None:  # in the environment, not argv: a URL may hold a password
        env[STATE_ENV] = state
    cmd = [
        sys.executable,
        "-m",
        "aicluster.api.server",
        "--home",
        str(home),
        "--ray-address",
        ray_address,
        "--host",
        host,
        "--port",
        str(port),
        "--policy",
        policy,
        "--retire-down-after",
        f"{retire_down_after:g}",
        "--log-format",
        log_format,
    ]
    for path in shared:
        cmd += ["--shared-path", path]
    log_path = home / (f"controlplane-{port}.log" if replica else "controlplane.log")
    if replica:
        cmd.append("--replica")
    start_and_wait(cmd, env, log_path, lambda: _healthy(url), "the control plane", 120)
    return url


def up(
    head: Annotated[
        bool, typer.Option("--head", help="accept other machines (aicluster join)")
    ] = False,
    address: Annotated[
        str, typer.Option(help="IP Ray binds to; other machines need a routable one")
    ] = "127.0.0.1",
    ray_port: Annotated[int, typer.Option(help="Ray head port (0: any free port)")] = 0,
    api_host: Annotated[str, typer.Option(help="API bind address")] = "127.0.0.1",
    api_port: Annotated[int, typer.Option(help="API port")] = 8765,
    num_cpus: Annotated[int | None, typer.Option(help="CPUs this node offers")] = None,
    num_gpus: Annotated[int | None, typer.Option(help="GPUs this node offers")] = None,
    pool: Annotated[str, typer.Option(help="pool of this node")] = "default",
    label: Annotated[list[str] | None, typer.Option(help="node label key=value")] = None,
    policy: Annotated[str, typer.Option(help="scheduling policy: fair, fifo or backfill")] = "fair",
    shared_path: Annotated[
        list[str] | None,
        typer.Option(help="a folder every job may read and write (shared storage); repeatable"),
    ] = None,
    retire_down_after: Annotated[
        float,
        typer.Option(
            help="seconds a node may stay Down before it is retired (no longer listed; its "
            "events are kept); 0: never on its own"
        ),
    ] = 600.0,
    log_format: Annotated[
        str,
        typer.Option(
            help="the control plane's log (AICLUSTER_HOME/controlplane.log): text "
            "(key=value lines) or json (one JSON object per line)"
        ),
    ] = "text",
    state: Annotated[
        str | None,
        typer.Option(
            "--state",
            help="where the control plane keeps its state: a SQLite file (default "
            "AICLUSTER_HOME/state.db) or postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE; "
            "remembered for later starts (AICLUSTER_HOME/state.json)",
        ),
    ] = None,
    ray_gcs_state: Annotated[
        str | None,
        typer.Option(
            "--ray-gcs-state",
            help="where Ray keeps the cluster's state, so that a head lost and started again "
            "(same address, within 60 s) gets its nodes and running work back: memory (Ray's "
            "default: a new head starts an empty cluster), redis://HOST:PORT (an external "
            "Redis) or rocksdb:/PATH (a folder on a volume that outlives the head); "
            "remembered for later starts",
        ),
    ] = None,
    gateway_port: Annotated[
        int | None,
        typer.Option(
            help="port of the gateway process (the OpenAI and Ollama routes; default: the "
            "API port + 1); it binds to --api-host"
        ),
    ] = None,
    gateway_workers: Annotated[
        int,
        typer.Option(
            help="gateway processes sharing that port (SO_REUSEPORT); 0: none (the API "
            "port serves the same routes)",
            min=0,
            max=64,
        ),
    ] = 1,
    join_control_plane: Annotated[
        bool,
        typer.Option(
            "--join-control-plane",
            help="start a further control-plane replica on this machine, on the "
            "installation's PostgreSQL state and Ray cluster (this machine must be the head "
            "or have joined with `aicluster join`); it serves the API and leads when the "
            "leader stops renewing its lease. Give it its own --api-port",
        ),
    ] = False,
) -> None:
    """Start Ray and the control plane on this machine (state in AICLUSTER_HOME, or in
    PostgreSQL with --state)."""
    if policy not in ("fair", "fifo", "backfill"):
        err.print(f"[red]--policy must be fair, fifo or backfill, not {policy!r}[/red]")
        raise typer.Exit(2)
    if log_format not in ("text", "json"):
        err.print(f"[red]--log-format must be text or json, not {log_format!r}[/red]")
        raise typer.Exit(2)
    from aicluster.engine.gcs_state import GcsStateError, describe, parse
    from aicluster.engine.protocol import MACHINE_LABEL
    from aicluster.engine.raynode import RayStartError, start_head

    labels = _node_labels(pool, label)  # checked before anything is written
    try:
        parse(ray_gcs_state)
    except GcsStateError as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None

    home = home_dir()
    home.mkdir(parents=True, exist_ok=True)
    os.chmod(home, 0o700)
    if join_control_plane:
        _join_control_plane(home, state, api_host, api_port, policy, log_format)
        return
    state_url, _ = state_location(home, state)  # checked before anything starts
    check_reachable(state_url)
    if state is not None:
        remember_state(home, state_url)
    labels[MACHINE_LABEL] = _machine_id(home)
    state = _read_json(home / "platform.json")
    cp = _read_json(home / "controlplane.json")
    if state.get("ray_address") and _pid_alive(cp.get("pid")) and _healthy(cp.get("url", "")):
        out.print(f"aicluster is already up: API {cp['url']}")
        return
    ray_address = state.get("ray_address")
    gcs_state = ray_gcs_state if ray_gcs_state is not None else state.get("ray_gcs_state")
    if not ray_address or not _ray_alive(home):
        _clear_stale_work(home)
        if gcs_state not in (None, "memory") and ray_address and not ray_port:
            # Worker nodes reconnect to the address they knew: the head comes back there.
            ray_port = int(ray_address.rsplit(":", 1)[1])
        try:
            ray_address = start_head(
                home,
                node_ip=address,
                port=ray_port,
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                labels=labels,
                gcs_state=gcs_state,
            )
        except RayStartError as exc:
            err.print(f"[red]{exc}[/red]")
            raise typer.Exit(1) from None
        _write_json(
            home / "platform.json",
            {"role": "head", "ray_address": ray_address, "head": head, "ray_gcs_state": gcs_state},
        )
    for path in shared_path or []:
        if not Path(path).is_dir():
            err.print(f"[red]--shared-path {path}: not a folder[/red]")
            raise typer.Exit(2)
    url = _start_control_plane(
        home,
        ray_address,
        api_host,
        api_port,
        policy,
        [str(Path(p).resolve()) for p in shared_path or []],
        retire_down_after,
        log_format=log_format,
        state=state_url,
    )
    _write_json(home / "client.json", {"url": url})
    gateway_url = None
    if gateway_workers:
        gateway_url = running_gateway(home) or start_gateway(
            home,
            url,
            api_host,
            gateway_port or api_port + 1,
            gateway_workers,
            {**os.environ, **ray_env(home, ray_address.startswith("127."))},
        )
    out.print(f"aicluster is up.\n  API:         {url}  (OpenAPI docs at {url}/docs)")
    if gateway_url:
        out.print(f"  gateway:     {gateway_url}/v1  (OpenAI and Ollama routes)")
    out.print(
        f"  admin token: {home / 'admin.token'}  (export AICLUSTER_TOKEN=$(cat {home / 'admin.token'}))"
    )
    out.print(f"  Ray head:    {ray_address}  (cluster state: {describe(gcs_state)})")
    from aicluster.runtime.sandbox import SANDBOX_WARNING, node_can_sandbox

    if not node_can_sandbox():
        err.print(f"[bold red]WARNING:[/bold red] {SANDBOX_WARNING}")
    if head:
        out.print(
            f"  add a machine: aicluster join {ray_address} --ray-token-file <copy of "
            f"{ray_token_path(home)}> --pool NAME"
        )


def _join_control_plane(
    home: Path, state: str | None, host: str, port: int, policy: str, log_format: str
) -> None:
    """`up --join-control-plane`: one more replica on this machine's Ray node."""
    state_url, _ = state_location(home, state)
    if not state_url.startswith("postgresql"):
        err.print(
            "[red]--join-control-plane: replicas share a PostgreSQL state database; give "
            "--state postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE (the one the first "
            "control plane uses)[/red]"
        )
        raise typer.Exit(2)
    check_reachable(state_url)
    if state is not None:
        remember_state(home, state_url)
    platform = _read_json(home / "platform.json")
    ray_address = platform.get("ray_address") or platform.get("head")
    if not ray_address:
        err.print(
            "[red]--join-control-plane: this machine is not in the cluster; run `aicluster "
            "join HEAD` here first (a control plane runs on a Ray node)[/red]"
        )
        raise typer.Exit(2)
    url = f"http://{host}:{port}"
    if _healthy(url):
        err.print(f"[red]--api-port {port}: a control plane already answers at {url}[/red]")
        raise typer.Exit(2)
    url = _start_control_plane(
        home, ray_address, host, port, policy, log_format=log_format, state=state_url, replica=True
    )
    if not (home / "client.json").exists():
        _write_json(home / "client.json", {"url": url})
    out.print(f"control-plane replica up: API {url}  (log {home / f'controlplane-{port}.log'})")
    out.print("  it follows until the leader stops renewing its lease; see `aicluster status`")


def _ray_alive(home: Path) -> bool:
    from aicluster.engine.raynode import installation_processes

    return any("gcs_server" in " ".join(p.cmdline()) for p in installation_processes(home))


def _clear_stale_work(home: Path) -> None:
    """Before this installation's Ray starts on this machine, no workload of it can be
    running here: the folders of attempts killed with the machine (or its Ray) go."""
    from aicluster.engine.rayenv import ray_temp_dir

    shutil.rmtree(ray_temp_dir(home) / "aicluster-work", ignore_errors=True)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


def down() -> None:
    """Stop the control plane and every Ray process this installation started."""
    from aicluster.engine.raynode import kill_installation

    home = home_dir()
    stop_gateway(home)
    # further replicas first (`up --join-control-plane`), so the main one is not replaced
    for path in [*sorted(home.glob("controlplane-*.json")), home / "controlplane.json"]:
        pid = _read_json(path).get("pid")
        if _pid_alive(pid):
            os.kill(pid, signal.SIGTERM)
            try:
                psutil.Process(pid).wait(timeout=30)
            except psutil.TimeoutExpired:
                os.kill(pid, signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        path.unlink(missing_ok=True)
    n = kill_installation(home)
    _clear_stale_work(home)  # the workloads' folders
    (home / "platform.json").unlink(missing_ok=True)
    out.print(f"aicluster is down ({n} Ray process(es) stopped)")


def join(
    head_address: Annotated[str, typer.Argument(help="the head's Ray address, host:port")],
    pool: Annotated[str, typer.Option(help="pool of this node")] = "default",
    label: Annotated[list[str] | None, typer.Option(help="node label key=value")] = None,
    address: Annotated[str, typer.Option(help="IP this node's Ray binds to")] = "127.0.0.1",
    num_cpus: Annotated[int | None, typer.Option(help="CPUs this node offers")] = None,
    num_gpus: Annotated[int | None, typer.Option(help="GPUs this node offers")] = None,
    gpu_model: Annotated[str | None, typer.Option(help="GPU model, e.g. H100")] = None,
    ray_token_file: Annotated[
        Path | None, typer.Option(help="the head's Ray token file (copy it from the head)")
    ] = None,
) -> None:
    """Add this machine to a cluster as a worker node."""
    from aicluster.engine.protocol import GPU_MODEL_LABEL, MACHINE_LABEL
    from aicluster.engine.raynode import RayStartError
    from aicluster.engine.raynode import join as ray_join

    labels = _node_labels(pool, label)  # checked before anything is written
    if gpu_model:
        if not _LABEL_VALUE.fullmatch(gpu_model):
            err.print(
                f"[red]--gpu-model must be letters, digits, '.', '_', '-', got {gpu_model[:80]!r}[/red]"
            )
            raise typer.Exit(2)
        labels[GPU_MODEL_LABEL] = gpu_model
    home = home_dir()
    home.mkdir(parents=True, exist_ok=True)
    labels[MACHINE_LABEL] = _machine_id(home)
    if ray_token_file is not None:
        try:
            token = ray_token_file.read_text().strip()
        except OSError as exc:
            err.print(f"[red]--ray-token-file: cannot read {ray_token_file}: {exc.strerror}[/red]")
            raise typer.Exit(2) from None
        dest = ray_token_path(home)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token)
    elif not ray_token_path(home).exists():
        err.print("[red]--ray-token-file is required: the head's Ray token file[/red]")
        raise typer.Exit(2)
    if not _ray_alive(home):
        _clear_stale_work(home)
    try:
        ray_join(
            home, head_address, node_ip=address, num_cpus=num_cpus, num_gpus=num_gpus, labels=labels
        )
    except RayStartError as exc:
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from None
    _write_json(home / "platform.json", {"role": "worker", "head": head_address})
    out.print(f"joined {head_address} as a node of pool {pool}")


def info() -> None:
    """Where the API listens and how to authenticate."""
    home = home_dir()
    cp = _read_json(home / "controlplane.json")
    url = cp.get("url")
    if not url or not _healthy(url):
        err.print(
            f"aicluster is not running for AICLUSTER_HOME={home} (start it with: aicluster up)"
        )
        raise typer.Exit(1)
    token = home / "admin.token"
    out.print(f"API:          {url}   (OpenAPI: {url}/docs)")
    gateway_url = running_gateway(home)
    if gateway_url:
        out.print(f"gateway:      {gateway_url}/v1   (OpenAI and Ollama routes)")
    out.print(f"admin token:  {token}")
    out.print(f"use it:       export AICLUSTER_TOKEN=$(cat {token})")
    out.print("stop it all:  aicluster down")


def register(app: typer.Typer) -> None:
    from aicluster.cli import replicas_cmds

    replicas_cmds.register(app)  # `aicluster status`
    app.command()(info)
    app.command()(up)
    app.command()(down)
    app.command()(join)
