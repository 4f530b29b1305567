"""RayEngine: realises the scheduler's decisions on a Ray cluster, exactly.

A gang is a detached placement group `aic-<job>-a<attempt>` whose bundle i is
pinned (label selector `ray.io/node-id`) to placement[i], and one detached actor
per bundle, `aic-<job>-a<attempt>-r<rank>`, that runs the worker's command.
Detached lifetimes let gangs outlive a control-plane restart; names let a new
control plane find them again. Every Ray call of aicluster lives in this module
and in engine.worker_actor (the actor class, kept light: a worker imports it).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import secrets
import time
import uuid

import ray
from ray.experimental import internal_kv
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

from aicluster.engine import actor_pool
from aicluster.engine.actor_pool import ALIAS_NAMESPACE, POOL_PREFIX, ActorPool, Idle
from aicluster.engine.logsink import start_sink
from aicluster.engine.prestart import PER_NODE, Prestarter, raylet_prestart
from aicluster.engine.protocol import (
    GPU_MODEL_LABEL,
    MACHINE_LABEL,
    POOL_LABEL,
    LaunchError,
    LaunchRequest,
    NodeInfo,
    WorkerState,
)
from aicluster.engine.worker_actor import FENCE_NAMESPACE, RemoteWorker, fence_key
from aicluster.runtime.launchers import Gang, rank_command
from aicluster.runtime.torchenv import worker_env

log = logging.getLogger(__name__)
NAMESPACE = "aicluster"
_ACTOR_RE = re.compile(r"^aic-(?P<job>.+)-a(?P<attempt>\d+)-r(?P<rank>\d+)$")
_GANG_RE = re.compile(r"^aic-(?P<job>.+)-a(?P<attempt>\d+)$")
_LOST = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, ValueError)
SINK_READ_TIMEOUT_S = 2.0
# A stopped gang's tail stays in the sink this long: the pull that follows a stop
# reads what the workers printed while stopping.
SINK_FORGET_AFTER_S = 60.0
# An attempt's fence is kept this long: longer than any launch of a control plane that
# lost its lease can still be on its way (its calls time out well within it).
FENCE_KEEP_S = 24 * 3600.0
FENCE_SWEEP_EVERY_S = 3600.0


def gang_name(job_id: str, attempt: int) -> str:
    return f"aic-{job_id}-a{attempt}"


def actor_name(job_id: str, attempt: int, rank: int) -> str:
    return f"{gang_name(job_id, attempt)}-r{rank}"


class RayEngine:
    def __init__(
        self,
        address: str,
        *,
        call_timeout: float = 10.0,
        launch_timeout: float = 60.0,
        sandbox_for=None,
        warm_workers: int = PER_NODE,
        pooled_actors: int = actor_pool.PER_NODE,
    ):
        """`sandbox_for(team) -> dict | None`: the SandboxPolicy (runtime.sandbox) that the
        team's workloads run under on every node; None runs them unsandboxed.
        `warm_workers`: idle Ray workers kept started on every node (engine.prestart);
        `pooled_actors`: idle worker actors kept on every node for CPU ranks
        (engine.actor_pool)."""
        if not ray.is_initialized():
            ray.init(
                address=address,
                namespace=NAMESPACE,
                log_to_driver=False,
                logging_level=logging.WARNING,
                _node_ip_address="127.0.0.1" if address.startswith("127.") else None,
            )
        self.call_timeout = call_timeout
        self.launch_timeout = launch_timeout
        self.sandbox_for = sandbox_for or (lambda _team: None)
        self.sink = self._start_sink()
        self.prestarter = self._start_prestarter(warm_workers)
        self.pool = ActorPool(self._pool_create, self._pool_kill, pooled_actors)
        self.aliases: dict[tuple[str, int, int], str] = {}  # rank -> its pooled actor's name
        self._fences_swept = 0.0  # when `_fence` last dropped old fences

    @staticmethod
    def _start_prestarter(per_node: int) -> Prestarter | None:
        try:
            send = raylet_prestart(ray.get_runtime_context().get_job_id())
        except Exception:  # noqa: BLE001 - an optimisation; launches work without it
            log.warning("no warm workers: every actor starts a fresh interpreter")
            return None
        return Prestarter(send, per_node)

    def _start_sink(self):
        """The cluster's log sink, pinned to this driver's node (a worker node that dies
        cannot take it down); None when it cannot be created (logs then come only from
        the workers' files)."""
        try:
            return start_sink(ray.get_runtime_context().get_node_id(), NAMESPACE)
        except Exception:  # noqa: BLE001 - streaming is best effort
            log.warning("no log sink: output printed just before a node dies may be lost")
            return None

    def _pool_create(self, node_id: str) -> Idle:
        name = f"{POOL_PREFIX}{uuid.uuid4().hex[:16]}"
        handle = RemoteWorker.options(
            name=name,
            lifetime="detached",
            num_cpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(idle_s=actor_pool.IDLE_S)
        up = handle.where.remote()
        if self.prestarter is not None:
            self.prestarter.used([node_id])  # it took one of the node's warm workers
        return Idle(name, handle, lambda: bool(ray.wait([up], timeout=0)[0]))

    @staticmethod
    def _pool_kill(idle: Idle) -> None:
        ray.kill(idle.handle, no_restart=True)

    def close(self) -> None:
        self.pool.stop()
        ray.shutdown()

    # -- inventory ----------------------------------------------------------------

    def nodes(self) -> list[NodeInfo]:
        """Ray's nodes as incarnations of machines: the machine id is the node's
        MACHINE_LABEL (its Ray node id without one) and names the node,
        `hostname-<machine id[:6]>`, the same across rejoins. Neither id is a user label."""
        out, raylets = [], []
        for n in ray.nodes():
            res, labels = n.get("Resources", {}), dict(n.get("Labels") or {})
            labels.pop("ray.io/node-id", None)
            machine_id = labels.pop(MACHINE_LABEL, None) or n["NodeID"]
            host = n.get("NodeManagerHostname") or n.get("NodeName", "")
            out.append(
                NodeInfo(
                    node_id=n["NodeID"],
                    machine_id=machine_id,
                    name=f"{host}-{machine_id[:6]}",
                    address=n.get("NodeManagerAddress", ""),
                    alive=bool(n.get("Alive")),
                    cpus=float(res.get("CPU", 0)),
                    memory=int(res.get("memory", 0)),
                    gpus=int(res.get("GPU", 0)),
                    gpu_model=labels.get(GPU_MODEL_LABEL) or _accelerator(res),
                    pool=labels.get(POOL_LABEL, "default"),
                    labels=labels,
                    is_head="node:__internal_head__" in res,
                )
            )
            if n.get("Alive") and res.get("CPU"):
                raylets.append(
                    (n["NodeID"], n.get("NodeManagerAddress"), n.get("NodeManagerPort"), res["CPU"])
                )
        if self.prestarter is not None:
            self.prestarter.seen(raylets)
        self.pool.seen([r[0] for r in raylets])
        return out

    # -- gangs --------------------------------------------------------------------

    def launch(self, req: LaunchRequest) -> tuple[str, int]:
        """Create the pinned placement group and start one worker per bundle.

        Returns rank 0's address and the free port reserved there (MASTER_ADDR/PORT).

        Raises LaunchError when the group cannot be placed or a worker cannot start;
        whatever was created is then removed again.
        """
        self._forget(req.job_id, req.attempt)  # a stale tail of an earlier launch
        bundle = {"CPU": req.cpus}
        if req.gpus:
            bundle["GPU"] = req.gpus
        if req.memory:
            bundle["memory"] = req.memory
        took = [time.monotonic()]  # placed, actors up, started: logged per launch
        try:
            pg = placement_group(
                [dict(bundle) for _ in req.placement],
                strategy="PACK",
                name=gang_name(req.job_id, req.attempt),
                lifetime="detached",
                bundle_label_selector=[{"ray.io/node-id": n} for n in req.placement],
            )
            if not pg.wait(timeout_seconds=self.launch_timeout):
                raise LaunchError(
                    "placement group not ready in time (capacity taken outside aicluster?)"
                )
            took.append(time.monotonic())
            actors, where = self._workers(req, pg)
            took.append(time.monotonic())
            master_addr, master_port = ray.get(
                actors[0].node_address.remote(where[0]["ip"]), timeout=self.call_timeout
            )
            workdir = ray.put(req.workdir) if req.workdir else None
            sandbox = self.sandbox_for(req.team or req.env.get("AICLUSTER_TEAM") or "default")
            gang = Gang.of(
                req.launcher,
                req.placement,
                [w["ip"] for w in where],
                [w["gpu_ids"] for w in where],
                master_addr,
                master_port,
            )
            secret = secrets.token_hex(16)  # the attempt's: mpi's relay (runtime.mpirelay)
            peers = self._swarm(req, gang, actors, where, secret)
            starts = []
            for rank, actor in enumerate(actors):
                env = dict(req.env)
                env.update(
                    worker_env(
                        placement=req.placement,
                        rank=rank,
                        master_addr=master_addr,
                        master_port=master_port,
                        gpu_ids=where[rank]["gpu_ids"],
                    )
                )
                env["AICLUSTER_NODE_ID"] = where[rank]["node_id"]
                # What Ray gives an actor holding the rank's CPUs (a pooled one holds
                # none, and Ray would say 1): the job's own value wins.
                env.setdefault("OMP_NUM_THREADS", str(max(1, math.floor(req.cpus))))
                command, launch_env = rank_command(
                    req.launcher, req.command, gang, rank, secret=secret
                )
                env.update(launch_env)
                starts.append(
                    actor.start.remote(
                        command,
                        env,
                        workdir,
                        list(req.inputs),
                        req.storage,
                        sandbox,
                        peers[rank],
                    )
                )
            ray.get(starts, timeout=self.launch_timeout)
            took.append(time.monotonic())
            log.info(
                "launched %s: placement %.2f s, actors %.2f s, start %.2f s",
                gang_name(req.job_id, req.attempt),
                *(b - a for a, b in zip(took, took[1:])),
            )
            return master_addr, master_port
        except LaunchError:
            self.stop(req.job_id, req.attempt, len(req.placement))
            raise
        except Exception as exc:
            self.stop(req.job_id, req.attempt, len(req.placement))
            raise LaunchError(f"{type(exc).__name__}: {exc}") from exc

    def _workers(self, req: LaunchRequest, pg) -> tuple[list, list[dict]]:
        """One worker actor per rank, up, and where each runs: a CPU rank binds an idle
        pooled actor of its node when there is one (engine.actor_pool), any other rank
        (or one whose pooled actor expired meanwhile) gets an actor made for it."""
        actors: list = [None] * len(req.placement)
        where: list = [None] * len(req.placement)
        bound = {}
        for rank, node_id in enumerate(req.placement):
            idle = None if req.gpus else self.pool.take(node_id)
            if idle is None:
                continue
            key = (req.job_id, req.attempt, rank)
            # The alias first: a control plane that dies before the bind leaves an
            # alias to an idle actor (it expires; a stop kills it), never a bound
            # actor that nothing names.
            internal_kv._internal_kv_put(actor_name(*key), idle.name, namespace=ALIAS_NAMESPACE)
            self.aliases[key] = idle.name
            bound[rank] = (idle, idle.handle.bind.remote(*key, self.sink))
        for rank, (idle, ref) in bound.items():
            try:
                where[rank] = ray.get(ref, timeout=self.call_timeout)
            except Exception:  # noqa: BLE001 - dead or expired: a fresh actor instead
                where[rank] = None
            if where[rank] is not None:
                actors[rank] = idle.handle
                continue
            self._pool_kill_quietly(idle)
            self._unalias(req.job_id, req.attempt, rank)
        fresh = [rank for rank in range(len(req.placement)) if actors[rank] is None]
        for rank in fresh:
            actors[rank] = RemoteWorker.options(
                name=actor_name(req.job_id, req.attempt, rank),
                lifetime="detached",
                num_cpus=req.cpus,
                num_gpus=req.gpus,
                memory=req.memory or None,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    pg, placement_group_bundle_index=rank
                ),
            ).remote(req.job_id, req.attempt, rank, self.sink)
        ups = ray.get([actors[r].where.remote() for r in fresh], timeout=self.launch_timeout)
        for rank, up in zip(fresh, ups):
            where[rank] = up
        if fresh and self.prestarter is not None:
            self.prestarter.used([where[r]["node_id"] for r in fresh])
        return actors, where

    def _pool_kill_quietly(self, idle: Idle) -> None:
        try:
            self._pool_kill(idle)
        except Exception:  # noqa: BLE001 - gone already
            pass

    def _unalias(self, job_id: str, attempt: int, rank: int) -> None:
        self.aliases.pop((job_id, attempt, rank), None)
        try:
            internal_kv._internal_kv_del(
                actor_name(job_id, attempt, rank), namespace=ALIAS_NAMESPACE
            )
        except Exception:  # noqa: BLE001 - best effort: a stale alias names a dead actor
            pass

    def _swarm(self, req: LaunchRequest, gang: Gang, actors, where, secret: str):
        """Per node of a multi-node gang with inputs, its place in the swarm that shares
        them, per rank (runtime.peers: each node's leader serves its cache on a port reserved
        on its node, the attempt's secret authenticates); None per rank otherwise."""
        if not req.inputs or len(gang.nodes) < 2:
            return [None] * len(req.placement)
        leaders = [ranks[0] for ranks in gang.nodes]
        addrs = ray.get(
            [actors[r].node_address.remote(where[r]["ip"]) for r in leaders],
            timeout=self.call_timeout,
        )
        plan = {"addrs": [list(a) for a in addrs], "secret": secret}
        return [
            plan | {"node": gang.node_of(r), "serve": r in leaders}
            for r in range(len(req.placement))
        ]

    def status(
        self, job_id: str, attempt: int, offsets: list[int], fence: bool = False
    ) -> list[WorkerState]:
        """A live rank's log comes from its worker's file; a lost or unresponsive rank's
        from the log sink (engine.logsink), which holds the tail its worker streamed
        off the node as it was written (see `_sink_tail` for what it may lack).
        `fence`: a rank not started now never starts (runtime.worker): the attempt's
        fence is written to the cluster's store first, so that a rank whose actor the
        dead control plane's launch makes only after this look refuses to start too."""
        if fence:
            self._fence(job_id, attempt)
        refs = {}
        states: dict[int, WorkerState] = {}
        from_sink: dict[int, int] = {}  # rank -> offset, for ranks whose file is out of reach
        for rank, offset in enumerate(offsets):
            actor = self._actor(job_id, attempt, rank)
            if actor is None:
                states[rank] = WorkerState(rank, lost=True)
                from_sink[rank] = offset
            else:
                refs[rank] = actor.status.remote(offset, fence=fence)
        for rank, ref in refs.items():
            try:
                st = ray.get(ref, timeout=self.call_timeout)
                states[rank] = WorkerState(
                    rank, st["started"], st["exit_code"], False, st["log"], st["pid"]
                )
            except _LOST:
                states[rank] = WorkerState(rank, lost=True)
                from_sink[rank] = offsets[rank]
            except ray.exceptions.GetTimeoutError:
                states[rank] = WorkerState(rank, started=True)  # busy: unknown, not lost
                from_sink[rank] = offsets[rank]
        for rank, data in self._sink_tail(job_id, attempt, from_sink).items():
            states[rank] = dataclasses.replace(states[rank], log=data)
        return [states[r] for r in range(len(offsets))]

    def _fence(self, job_id: str, attempt: int) -> None:
        """Write the attempt's fence (engine.worker_actor FENCE_NAMESPACE); drop the ones
        older than FENCE_KEEP_S now and then. Raises when it cannot be written: the
        takeover then redoes nothing on a look it could not make safe."""
        now = time.time()
        internal_kv._internal_kv_put(
            fence_key(job_id, attempt), str(now), namespace=FENCE_NAMESPACE
        )
        if now - self._fences_swept < FENCE_SWEEP_EVERY_S:
            return
        self._fences_swept = now
        try:
            for key in internal_kv._internal_kv_list("aic-", namespace=FENCE_NAMESPACE):
                written = internal_kv._internal_kv_get(key, namespace=FENCE_NAMESPACE)
                if written is not None and now - float(written) > FENCE_KEEP_S:
                    internal_kv._internal_kv_del(key, namespace=FENCE_NAMESPACE)
        except Exception:  # best effort: the next sweep tries again
            log.warning("sweeping old launch fences", exc_info=True)

    def _sink_tail(self, job_id: str, attempt: int, offsets: dict[int, int]) -> dict[int, bytes]:
        """What the sink holds of these ranks from their offsets, bytes that are the
        worker file's bytes at exactly those offsets. A rank gets nothing when the sink
        is unreachable, holds nothing of it, or holds only bytes that start past its
        offset: bytes after a gap cannot be returned without breaking the reader's
        invariant that what it pulled ends where the next pull starts (control.logs)."""
        if self.sink is None or not offsets:
            return {}
        asks = [((job_id, attempt, rank), offset) for rank, offset in offsets.items()]
        try:
            held = ray.get(self.sink.read.remote(asks), timeout=SINK_READ_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - best effort: the sink may be gone or busy
            return {}
        out = {}
        for (_job, _attempt, rank), (start, data) in held.items():
            if data and start == offsets.get(rank):
                out[rank] = data
        return out

    def _forget(self, job_id: str, attempt: int, after: float = 0.0) -> None:
        if self.sink is None:
            return
        try:
            self.sink.forget.remote(job_id, attempt, after)
        except Exception:  # noqa: BLE001 - best effort
            pass

    def stop(self, job_id: str, attempt: int, workers: int, grace: float = 5.0) -> None:
        """Kill every worker process, then the actors, then free the placement group."""
        actors = [self._actor(job_id, attempt, r) for r in range(workers)]
        actors = [a for a in actors if a is not None]
        pending = [a.stop.remote(grace) for a in actors]
        for ref in pending:
            try:
                ray.get(ref, timeout=grace + 10)
            except Exception:  # noqa: BLE001 - a dead worker has nothing left to stop
                pass
        for a in actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        for r in range(workers):
            self._unalias(job_id, attempt, r)
        try:
            pg = ray.util.get_placement_group(gang_name(job_id, attempt))
            remove_placement_group(pg)
        except ValueError:
            pass
        self._forget(job_id, attempt, after=SINK_FORGET_AFTER_S)

    def scan_output(self, job_id: str, attempt: int, path: str) -> list[dict]:
        """Rank 0's output folder as file entries (path, size, sha256)."""
        actor = self._actor(job_id, attempt, 0)
        if actor is None:
            raise LaunchError("rank 0 is gone; its outputs cannot be read")
        return ray.get(actor.scan_output.remote(path), timeout=600)

    def upload_output(
        self, job_id: str, attempt: int, path: str, digests: list[str], storage
    ) -> int:
        actor = self._actor(job_id, attempt, 0)
        if actor is None:
            raise LaunchError("rank 0 is gone; its outputs cannot be read")
        return ray.get(actor.upload_output.remote(path, digests, storage), timeout=3600)

    def running_gangs(self) -> set[tuple[str, int]]:
        """(job id, attempt) of every gang that still has a named actor or placement group."""
        out = set()
        for name in ray.util.list_named_actors(all_namespaces=False):
            m = _ACTOR_RE.match(name)
            if m:
                out.add((m["job"], int(m["attempt"])))
        for info in ray.util.placement_group_table().values():
            m = _GANG_RE.match(info.get("name") or "")
            if m and info.get("state") != "REMOVED":
                out.add((m["job"], int(m["attempt"])))
        for key in internal_kv._internal_kv_list("aic-", namespace=ALIAS_NAMESPACE):
            m = _ACTOR_RE.match(key.decode(errors="replace"))
            if m:
                out.add((m["job"], int(m["attempt"])))
        return out

    def _actor(self, job_id: str, attempt: int, rank: int):
        """The rank's worker actor: by its own name, or through its alias when it was
        a pooled actor (engine.actor_pool); None when it is gone."""
        name = self.aliases.get((job_id, attempt, rank))
        if name is None:
            try:
                return ray.get_actor(actor_name(job_id, attempt, rank), namespace=NAMESPACE)
            except ValueError:
                name = self._alias(job_id, attempt, rank)
                if name is None:
                    return None
                self.aliases[(job_id, attempt, rank)] = name
        try:
            return ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            return None

    @staticmethod
    def _alias(job_id: str, attempt: int, rank: int) -> str | None:
        try:
            value = internal_kv._internal_kv_get(
                actor_name(job_id, attempt, rank), namespace=ALIAS_NAMESPACE
            )
        except Exception:  # noqa: BLE001 - unknown: treated as no alias
            return None
        return value.decode() if value else None


def _accelerator(resources: dict) -> str | None:
    for key in resources:
        if key.startswith("accelerator_type:"):
            return key.split(":", 1)[1]
    return None
