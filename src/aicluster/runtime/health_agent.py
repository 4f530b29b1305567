"""The health agent's readings on its node: psutil, NVML (nvidia-ml-py) and the
admin's check commands. Pure judgement lives in core.health; this only measures.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import psutil

from aicluster.core.health import CommandOutcome, GpuReading, GpuSample, HostSample


def sample_host(path: str = "/") -> HostSample:
    disk = shutil.disk_usage(path)
    return HostSample(
        cpus=os.cpu_count() or 1,
        load_1m=os.getloadavg()[0],
        memory_used_pct=psutil.virtual_memory().percent,
        disk_free_bytes=disk.free,
        disk_total_bytes=disk.total,
    )


def sample_gpus() -> GpuSample:
    try:
        import pynvml
    except ImportError:
        return GpuSample(False, error="nvidia-ml-py is not installed")
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound and friends
        return GpuSample(False, error=f"NVML unavailable: {exc}")
    try:
        return GpuSample(True, tuple(_read(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount())))
    finally:
        pynvml.nvmlShutdown()


def _read(nv, index: int) -> GpuReading:
    h = nv.nvmlDeviceGetHandleByIndex(index)

    def maybe(fn, default):
        try:
            return fn()
        except Exception:  # noqa: BLE001 - a counter the device does not support
            return default

    ecc = maybe(
        lambda: nv.nvmlDeviceGetTotalEccErrors(
            h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
        ),
        0,
    )
    return GpuReading(
        index=index,
        name=str(maybe(lambda: nv.nvmlDeviceGetName(h), "")),
        temperature_c=float(
            maybe(lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU), 0)
        ),
        utilization_pct=float(maybe(lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu, 0)),
        ecc_uncorrected=int(ecc),
        processes=len(maybe(lambda: nv.nvmlDeviceGetComputeRunningProcesses(h), [])),
    )


def run_commands(commands: dict[str, str], timeout: float = 20.0) -> list[CommandOutcome]:
    out = []
    for name, cmd in sorted(commands.items()):
        try:
            p = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=timeout)
            out.append(CommandOutcome(name, p.returncode, (p.stdout + p.stderr)[-500:]))
        except subprocess.TimeoutExpired:
            out.append(CommandOutcome(name, None, "timed out"))
    return out
