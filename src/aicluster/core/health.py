"""Node health checks as pure functions over readings taken on the node.

Vocabulary: a HostSample is what psutil saw; a GpuReading is what NVML said about
one device; a CheckResult is ok, fail or not_applicable. Invariant: a check that
could not look (no NVML, no GPU) says not_applicable, never ok — a node without
readings is not called healthy for GPUs it cannot see.
"""

from __future__ import annotations

from dataclasses import dataclass, field

OK, FAIL, NA = "ok", "fail", "not_applicable"


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str
    message: str = ""


GiB = 1 << 30


@dataclass(frozen=True)
class Thresholds:
    """A disk is full when it is short on both counts: under `min_disk_free_pct` of its
    size *and* under `min_disk_free_bytes`. A percentage alone calls a large shared volume
    with gigabytes to spare full (a 252 GB disk with 4.8 GB free is at 1.9%, and such a
    node refused every service replica); bytes alone call a small disk fine when it is at
    its last few percent."""

    max_memory_used_pct: float = 97.0
    min_disk_free_pct: float = 3.0
    min_disk_free_bytes: int = 2 * GiB
    max_load_per_cpu: float = 8.0
    max_gpu_temp_c: float = 90.0
    stuck_util_pct: float = 99.0


@dataclass(frozen=True)
class HostSample:
    cpus: int
    load_1m: float
    memory_used_pct: float
    disk_free_bytes: int
    disk_total_bytes: int

    @property
    def disk_free_pct(self) -> float:
        if self.disk_total_bytes <= 0:
            return 100.0
        return 100.0 * self.disk_free_bytes / self.disk_total_bytes


@dataclass(frozen=True)
class GpuReading:
    index: int
    name: str = ""
    temperature_c: float = 0.0
    utilization_pct: float = 0.0
    ecc_uncorrected: int = 0
    xid_events: tuple[int, ...] = ()
    processes: int = 0


@dataclass(frozen=True)
class GpuSample:
    """`available` is False when NVML could not be loaded or initialised."""

    available: bool
    devices: tuple[GpuReading, ...] = ()
    error: str = ""


@dataclass(frozen=True)
class CommandOutcome:
    name: str
    exit_code: int | None  # None: timed out or could not run
    output: str = ""


@dataclass(frozen=True)
class HealthReport:
    checks: tuple[CheckResult, ...] = field(default_factory=tuple)

    @property
    def healthy(self) -> bool:
        return all(c.status != FAIL for c in self.checks)

    @property
    def reason(self) -> str:
        fails = [f"{c.name}: {c.message}" for c in self.checks if c.status == FAIL]
        return "; ".join(fails)


def check_host(s: HostSample, t: Thresholds = Thresholds()) -> list[CheckResult]:
    out = []
    mem = FAIL if s.memory_used_pct > t.max_memory_used_pct else OK
    out.append(CheckResult("memory", mem, f"{s.memory_used_pct:.0f}% used"))
    short = s.disk_free_pct < t.min_disk_free_pct and s.disk_free_bytes < t.min_disk_free_bytes
    free = f"{s.disk_free_bytes / GiB:.1f} GiB free ({s.disk_free_pct:.1f}%)"
    out.append(CheckResult("disk", FAIL if short else OK, free))
    per_cpu = s.load_1m / max(1, s.cpus)
    load = FAIL if per_cpu > t.max_load_per_cpu else OK
    out.append(CheckResult("cpu", load, f"load {s.load_1m:.1f} on {s.cpus} CPUs"))
    return out


def check_gpus(declared: int, sample: GpuSample, t: Thresholds = Thresholds()) -> list[CheckResult]:
    if not sample.available:
        why = sample.error or "no NVML on this node"
        if declared > 0:
            why += f"; the node declares {declared} GPU(s) that cannot be checked"
        return [CheckResult("gpu", NA, why)]
    out = []
    found = len(sample.devices)
    count_ok = found >= declared
    out.append(
        CheckResult("gpu_count", OK if count_ok else FAIL, f"{found} visible, {declared} declared")
    )
    for d in sample.devices:
        problems = []
        if d.ecc_uncorrected > 0:
            problems.append(f"{d.ecc_uncorrected} uncorrected ECC errors")
        if d.xid_events:
            problems.append("XID " + ",".join(str(x) for x in d.xid_events))
        if d.temperature_c > t.max_gpu_temp_c:
            problems.append(f"{d.temperature_c:.0f} C")
        if d.utilization_pct >= t.stuck_util_pct and d.processes == 0:
            problems.append("stuck at full utilisation with no process")
        out.append(
            CheckResult(
                f"gpu{d.index}",
                FAIL if problems else OK,
                "; ".join(problems) or f"{d.temperature_c:.0f} C",
            )
        )
    return out


def check_commands(outcomes: list[CommandOutcome]) -> list[CheckResult]:
    out = []
    for o in outcomes:
        if o.exit_code == 0:
            out.append(CheckResult(f"cmd:{o.name}", OK, "exit 0"))
        else:
            what = "timed out" if o.exit_code is None else f"exit {o.exit_code}"
            out.append(CheckResult(f"cmd:{o.name}", FAIL, f"{what} {o.output[-200:]}".strip()))
    return out


def evaluate(
    host: HostSample,
    gpus: GpuSample,
    declared_gpus: int,
    commands: list[CommandOutcome],
    t: Thresholds = Thresholds(),
) -> HealthReport:
    return HealthReport(
        tuple(check_host(host, t) + check_gpus(declared_gpus, gpus, t) + check_commands(commands))
    )
