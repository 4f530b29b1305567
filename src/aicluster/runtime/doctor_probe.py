"""`python -m aicluster.runtime.doctor_probe`: what each rank of an `aicluster doctor` job runs.

It is workload code: it runs sandboxed as the job, with only torch.distributed (NCCL
on GPUs, gloo otherwise), the SDK's artifact client on the job's own token, and the
torchrun-compatible environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT, AICLUSTER_NODE_ID);
never the store or Ray. Every figure is one line `DOCTOR {json}` on its rank's stdout
(core.doctor.Measurement; cli.doctor_cmds reads them from the job's logs and judges).

What it measures, in this order (every rank takes part in each step):
1. point-to-point bandwidth of every node pair, one pair at a time (the others wait at a
   barrier): ping-pong of `--p2p-bytes`, best of `--repeat`, 2 x bytes / round trip;
2. all-reduce sweeps over the first k nodes, k = 2, 4, 8, ... and N: message sizes from
   1 KiB to `--allreduce-bytes` (x4 steps); the time of a size is the slowest rank's mean;
   bus bandwidth = (bytes / time) x 2(k-1)/k, as nccl-tests define it (their
   doc/PERFORMANCE.md: busbw reflects how well the links are used, whatever the rank count);
3. one node at a time (so that nodes sharing a host do not measure each other): host
   memory copy and float32 matmul on the CPU; on GPUs a bf16 matmul (TFLOPS, CUDA-event
   timed) and a device-to-device copy (GB/s, read + write counted), NVML health and ECC;
   without CUDA or NVML these say not_applicable, never ok; then a push of
   `--storage-bytes` of random bytes to TEAM/JOBNAME-ckpt (the one name a job's token may
   push) and a pull of that version into an empty folder, without the node's cache;
   CPU and storage figures are the best of `--rounds` rounds, the nodes in turn in each.

`--inject-delay NODE_ID:MS` (given only by `aicluster doctor --inject-delay`, a self-test
of the verdicts): the rank on that node sleeps MS milliseconds before each message it
sends, each all-reduce it joins and each artifact transfer, as a link with that much
latency would. All Ray nodes of a one-machine test cluster share the kernel's loopback,
so `tc` on an interface would slow every pair alike; this slows exactly one node's links.

Invariants: bounded work (sizes are capped by the CLI's options; nothing grows with
time); every rank prints only its own figures (pairs: the lower rank of the pair); the
same sequence of collectives on every rank, so no rank waits on one that skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

MAX_BYTES = 1 << 30


def emit(**fields) -> None:
    """One result line, in one write(2) (ranks of a node may share a stdout)."""
    os.write(1, ("DOCTOR " + json.dumps(fields) + "\n").encode())


def _delay_for(spec: list[str], node: str) -> float:
    for item in spec:
        name, _, ms = item.rpartition(":")
        if name and node.startswith(name):
            return float(ms) / 1000.0
    return 0.0


class Probe:
    def __init__(self, args, dist, torch) -> None:
        self.args, self.dist, self.torch = args, dist, torch
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.cuda = torch.cuda.is_available()
        self.device = torch.device("cuda", 0) if self.cuda else torch.device("cpu")
        me = os.environ.get("AICLUSTER_NODE_ID", f"rank-{self.rank}")
        nodes: list = [None] * self.world
        dist.all_gather_object(nodes, me)
        self.nodes: list[str] = nodes
        self.node = me
        self.delay = _delay_for(args.inject_delay, me)

    def wait(self) -> None:
        if self.delay:
            time.sleep(self.delay)

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    # -- 1. node pairs --------------------------------------------------------------

    def p2p(self) -> None:
        torch, dist = self.torch, self.dist
        buf = torch.ones(max(1, self.args.p2p_bytes // 4), dtype=torch.float32, device=self.device)
        nbytes = buf.numel() * 4
        for a in range(self.world):
            for b in range(a + 1, self.world):
                if self.rank in (a, b):
                    peer = b if self.rank == a else a
                    best = None
                    for i in range(self.args.repeat + 1):  # the first is a warm-up
                        self.sync()
                        t0 = time.perf_counter()
                        if self.rank == a:
                            self.wait()
                            dist.send(buf, peer)
                            dist.recv(buf, peer)
                        else:
                            dist.recv(buf, peer)
                            self.wait()
                            dist.send(buf, peer)
                        self.sync()
                        took = time.perf_counter() - t0
                        if i and (best is None or took < best):
                            best = took
                    if self.rank == a:
                        emit(
                            check="p2p_bw",
                            node=self.node,
                            peer=self.nodes[b],
                            value=2 * nbytes / best / 1e9,
                            unit="GB/s",
                            bytes=nbytes,
                            round_trip_us=best * 1e6,
                        )
                dist.barrier()

    # -- 2. all-reduce sweeps -----------------------------------------------------------

    def allreduce(self) -> None:
        dist, torch = self.dist, self.torch
        counts = sorted({k for k in (2**i for i in range(1, 13)) if k < self.world} | {self.world})
        sizes, size = [], 1024
        while size < self.args.allreduce_bytes:
            sizes.append(size)
            size *= 4
        sizes.append(self.args.allreduce_bytes)
        for k in counts:
            if k < 2:
                continue
            group = dist.new_group(list(range(k)))  # every rank calls new_group
            if self.rank < k:
                sweep = []
                for nbytes in sizes:
                    t = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=self.device)
                    self.wait()
                    dist.all_reduce(t, group=group)  # warm-up
                    self.sync()
                    t0 = time.perf_counter()
                    for _ in range(self.args.iters):
                        self.wait()
                        dist.all_reduce(t, group=group)
                    self.sync()
                    took = torch.tensor(
                        [(time.perf_counter() - t0) / self.args.iters], device=self.device
                    )
                    dist.all_reduce(took, op=dist.ReduceOp.MAX, group=group)
                    sec = float(took.item())
                    algbw = t.numel() * 4 / sec / 1e9
                    sweep.append([t.numel() * 4, sec * 1e6, algbw, algbw * 2 * (k - 1) / k])
                if self.rank == 0:
                    emit(
                        check="allreduce_busbw",
                        value=sweep[-1][3],
                        unit="GB/s",
                        nodes=k,
                        bytes=sweep[-1][0],
                        sweep=sweep,
                        backend=dist.get_backend(),
                    )
                    emit(
                        check="allreduce_latency",
                        value=sweep[0][1],
                        unit="us",
                        nodes=k,
                        bytes=sweep[0][0],
                    )
            dist.barrier()

    # -- 3. each node on its own ---------------------------------------------------------

    def per_node(self) -> None:
        """`--rounds` rounds, each node in turn within a round, each figure the best of its
        node's rounds: every node's samples span the same stretch of time, so a burst of
        load on a shared host does not land on one node's figures alone."""
        best: dict[str, float] = {}
        failed: set[str] = set()
        for i in range(self.args.rounds):
            for r in range(self.world):
                if r == self.rank:
                    steps = [self.cpu, self.storage] + ([self.gpu] if i == 0 else [])
                    for step in steps:
                        if step.__name__ in failed:
                            continue
                        try:
                            step(best)
                        except Exception as exc:  # noqa: BLE001 - reported as a failed check
                            failed.add(step.__name__)
                            emit(
                                check="probe_error",
                                node=self.node,
                                value=None,
                                status="fail",
                                detail=f"{step.__name__}: {type(exc).__name__}: {exc}"[:500],
                            )
                self.dist.barrier()
        n, size = self.args.cpu_matmul, self.args.storage_bytes
        figures = {
            "cpu_mem_bw": lambda t: 2 * max(1, self.args.mem_bytes // 4) * 4 / t / 1e9,
            "cpu_matmul": lambda t: 2 * n**3 / t / 1e9,
            "storage_write": lambda t: size / t / 1e9,
            "storage_read": lambda t: size / t / 1e9,
        }
        for check, figure in figures.items():
            if check in best:
                emit(check=check, node=self.node, value=figure(best[check]))

    def _best(self, fn, repeat: int) -> float:
        fn()  # warm-up
        best = None
        for _ in range(repeat):
            self.sync()
            t0 = time.perf_counter()
            fn()
            self.sync()
            took = time.perf_counter() - t0
            best = took if best is None else min(best, took)
        return best

    def cpu(self, best: dict[str, float]) -> None:
        torch = self.torch
        a = torch.ones(max(1, self.args.mem_bytes // 4), dtype=torch.float32)
        b = torch.empty_like(a)
        _keep(best, "cpu_mem_bw", self._best(lambda: b.copy_(a), self.args.repeat))
        n = self.args.cpu_matmul
        x, y = torch.rand(n, n), torch.rand(n, n)
        _keep(best, "cpu_matmul", self._best(lambda: x @ y, self.args.repeat))

    def gpu(self, best: dict[str, float]) -> None:
        torch = self.torch
        if not self.cuda:
            why = "CUDA is not available on this node (torch.cuda.is_available() is False)"
            for check in ("gpu_matmul", "gpu_mem_bw"):
                emit(check=check, node=self.node, value=None, status="not_applicable", detail=why)
        else:
            for index in range(torch.cuda.device_count()):  # this worker's GPUs only
                self._one_gpu(torch.device("cuda", index), index)
        self.nvml()

    def _one_gpu(self, device, index: int) -> None:
        torch = self.torch
        with torch.cuda.device(device):
            n = self.args.gpu_matmul
            x = torch.randn(n, n, dtype=torch.bfloat16, device=device)
            y = torch.randn(n, n, dtype=torch.bfloat16, device=device)
            sec = self._cuda_time(lambda: x @ y)
            emit(check="gpu_matmul", node=self.node, gpu=index, value=2 * n**3 / sec / 1e12, n=n)
            x = y = None  # freed before the copy buffers
            src = torch.empty(self.args.gpu_mem_bytes, dtype=torch.uint8, device=device)
            dst = torch.empty_like(src)
            sec = self._cuda_time(lambda: dst.copy_(src))
            emit(check="gpu_mem_bw", node=self.node, gpu=index, value=2 * src.numel() / sec / 1e9)
            src = dst = None
            torch.cuda.empty_cache()

    def _cuda_time(self, fn) -> float:
        """Best seconds of `fn` over --repeat runs of --iters calls, timed by CUDA events."""
        torch = self.torch
        fn()
        torch.cuda.synchronize()
        best = None
        for _ in range(self.args.repeat):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(self.args.iters):
                fn()
            end.record()
            end.synchronize()
            sec = start.elapsed_time(end) / 1000.0 / self.args.iters
            best = sec if best is None else min(best, sec)
        return best

    def nvml(self) -> None:
        from aicluster.core.health import check_gpus
        from aicluster.runtime.health_agent import sample_gpus

        sample = sample_gpus()
        if not sample.available:
            for check in ("gpu_nvml", "gpu_ecc"):
                emit(
                    check=check,
                    node=self.node,
                    value=None,
                    status="not_applicable",
                    detail=sample.error or "NVML unavailable",
                )
            return
        declared = len([g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g])
        results = check_gpus(declared, sample)
        bad = [f"{c.name}: {c.message}" for c in results if c.status == "fail"]
        emit(
            check="gpu_nvml",
            node=self.node,
            value=None,
            status="fail" if bad else "ok",
            detail="; ".join(bad) or f"{len(sample.devices)} GPUs healthy",
        )
        modes = _ecc_modes()
        errors = sum(d.ecc_uncorrected for d in sample.devices)
        if not any(modes):
            emit(
                check="gpu_ecc",
                node=self.node,
                value=None,
                status="not_applicable",
                detail="ECC is off or not supported on these GPUs",
            )
        else:
            emit(
                check="gpu_ecc",
                node=self.node,
                value=errors,
                status="fail" if errors else "ok",
                detail=f"{errors} uncorrected (volatile) on {sum(modes)} GPUs with ECC on",
            )

    def storage(self, best: dict[str, float]) -> None:
        """One push of fresh random bytes (the store keeps one copy of equal bytes) and one
        pull of that version into an empty folder, without the node's cache."""
        if "AICLUSTER_TOKEN" not in os.environ:
            if "storage_na" not in best:
                best["storage_na"] = 0.0
                for check in ("storage_write", "storage_read"):
                    emit(check=check, node=self.node, value=None, status="not_applicable",
                         detail="not run as a platform job (no AICLUSTER_TOKEN)")  # fmt: skip
            return
        from aicluster.client import artifacts
        from aicluster.client.api import Client
        from aicluster.runtime.checkpoint import artifact_name

        name = artifact_name()
        with tempfile.TemporaryDirectory(prefix="doctor-") as tmp:
            blob = os.path.join(tmp, "blob.bin")
            with open(blob, "wb") as f:
                f.write(os.urandom(self.args.storage_bytes))
            with Client(os.environ["AICLUSTER_URL"], os.environ["AICLUSTER_TOKEN"]) as c:
                t0 = time.perf_counter()
                self.wait()
                v = artifacts.push(c, blob, name, "checkpoint", metadata={"doctor": self.node})
                _keep(best, "storage_write", time.perf_counter() - t0)
                t0 = time.perf_counter()
                self.wait()
                artifacts.pull(c, f"{name}:{v['version']}", os.path.join(tmp, "back"))
                _keep(best, "storage_read", time.perf_counter() - t0)


def _keep(best: dict[str, float], check: str, seconds: float) -> None:
    best[check] = min(best.get(check, seconds), seconds)


def _ecc_modes() -> list[bool]:
    """Per visible GPU: ECC currently on (NVML), [] when NVML cannot say."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no NVML: the caller says not_applicable
        return []
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            try:
                current, _ = pynvml.nvmlDeviceGetEccMode(pynvml.nvmlDeviceGetHandleByIndex(i))
                out.append(bool(current))
            except Exception:  # noqa: BLE001 - NVML_ERROR_NOT_SUPPORTED: no ECC
                out.append(False)
        return out
    finally:
        pynvml.nvmlShutdown()


def _size(text: str) -> int:
    value = int(text)
    if not 1 <= value <= MAX_BYTES:
        raise argparse.ArgumentTypeError(f"must be 1..{MAX_BYTES} bytes")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="doctor_probe")
    p.add_argument("--p2p-bytes", type=_size, default=4 << 20)
    p.add_argument("--allreduce-bytes", type=_size, default=4 << 20)
    p.add_argument("--storage-bytes", type=_size, default=8 << 20)
    p.add_argument("--mem-bytes", type=_size, default=64 << 20)
    p.add_argument("--gpu-mem-bytes", type=_size, default=MAX_BYTES)
    p.add_argument("--cpu-matmul", type=int, default=384)
    p.add_argument("--gpu-matmul", type=int, default=8192)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--inject-delay", action="append", default=[], metavar="NODE_ID:MS")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    import torch
    import torch.distributed as dist

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(0)  # the worker sees only its own GPUs (CUDA_VISIBLE_DEVICES)
    dist.init_process_group(backend)
    probe = Probe(args, dist, torch)
    probe.p2p()
    probe.allreduce()
    probe.per_node()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
