"""Calibration: this cluster's measured figures in place of the datasheet's.

`aicluster plan FILE --calibrate doctor.json` reads the report `aicluster doctor -o json`
printed (the CLI reads the file; `calibrate(inputs, report)` gets the parsed dict) and plans
with efficiencies measured on the cluster instead of assumed.

Vocabulary:
- a *figure* is one check's measured value in the report (core.doctor: `allreduce_busbw`,
  `p2p_bw`, `gpu_matmul`, ...); its *datasheet* is the catalog figure of the plan's
  hardware that `aicluster doctor --expect` judges it against.
- an *efficiency* is measured / datasheet; it replaces the assumption the plan would use.

What is calibrated (figure -> what the plan uses):
- `allreduce_busbw` of the all-reduce with the most nodes (a training gang's gradient sync
  is one), else the median `p2p_bw` of the node pairs -> `network_efficiency` = measured /
  one port's line rate: the doctor runs one rank per node, which drives one NIC, and NCCL's
  bus bandwidth is comparable with a link's rate whatever the rank count (nccl-tests).
- `gpu_mem_bw` (read + write counted, as datasheets count) -> `bandwidth_efficiency` =
  measured / the GPU's memory bandwidth (decode steps, weight reads).
- `gpu_matmul` -> `mfu_scale` = measured / (bf16 TFLOPS x `MATMUL_EFFICIENCY`), at most 1,
  and `prefill_efficiency` x that scale. The MFU table and the prefill efficiency come from
  published runs on healthy GPUs, which reach the floor or more: a GPU above it gains
  nothing over the table (noted), one below it loses its shortfall.
- `storage_read` / `storage_write` -> the storage's aggregate figures x min(1, measured /
  min(aggregate, one node's NICs)). The probe measures one node at a time, so it sees what
  one client gets, not the aggregate; a client that gets its whole bound leaves the
  catalog's aggregate standing, one that gets less scales it by the same share.
- Not calibrated: `allreduce_latency` (the planner's alpha is tensor parallel over NVLink
  inside a node; the probe's is between nodes), `cpu_*` (no planner figure), NVLink (the
  probe measures no link inside a node), health checks.

Rules:
- Ignored: not_applicable or null values; figures of the nodes the report's relative
  judgement fails (a node below half its peers' median, a node all of whose links are
  slow, a failed health check; re-judged here without the plan's expectations, so a
  cluster wholly below its plan is calibrated, not discarded) and pairs touching them or
  named slow links; and then every all-reduce, since the probe reduces over the first k
  ranks and the report does not say which (p2p_bw between the healthy nodes stands in).
- Several nodes (and GPUs) combine by their median. The slowest node does bound a
  synchronous gang, but the nodes that are truly slow are the ones excluded above (to be
  repaired or cordoned), and the minimum of one short sample per node is biased low by
  noise: it would derate every plan for one unlucky reading. The report gives the spread.
- Never above the datasheet: an efficiency over 1 is clamped to 1 and the clamp is noted.
- Figures are divided by the datasheet of the first workload's GPU and node (as
  `aicluster doctor --expect` does); other GPUs in the plan get the same efficiencies
  (noted).

Invariants: pure (no I/O); the inputs come back unchanged but for the calibrated
assumptions and storage figures; CalibrationError names the report field at fault
(`checks.3.value`), or `checks` when no figure is usable.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, replace

from aicluster.core import doctor as dr
from aicluster.planner.assumptions import MATMUL_EFFICIENCY
from aicluster.planner.inputs import PlanInputs

HEALTH = ("gpu_nvml", "gpu_ecc", "probe_error")
USED = ("allreduce_busbw", "p2p_bw", "gpu_mem_bw", "gpu_matmul", "storage_read", "storage_write")
VERDICTS = (dr.OK, dr.WARN, dr.FAIL, dr.NA, dr.UNJUDGED)


class CalibrationError(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


@dataclass(frozen=True)
class Calibrated:
    """One planner figure replaced by a measured one."""

    uses: str  # the assumption or catalog figure replaced: network_efficiency, storage.read_gb_s
    figure: str  # the doctor check it comes from
    measured: float  # the median of the samples used
    unit: str
    samples: int
    low: float
    high: float
    datasheet: float  # the catalog figure the measurement is set against
    datasheet_source: str
    before: float
    after: float
    clamped: bool = False


@dataclass(frozen=True)
class Calibration:
    items: tuple[Calibrated, ...]
    notes: tuple[str, ...]

    def to_dict(self) -> dict:
        return {"items": [asdict(i) for i in self.items], "notes": list(self.notes)}


def _optional_str(c: dict, key: str, where: str) -> str | None:
    v = c.get(key)
    if v is not None and not isinstance(v, str):
        raise CalibrationError(f"{where}.{key}", f"must be a node id (a string) or null, not {v!r}")
    return v


def measurements(report: dict) -> tuple[list[dr.Measurement], list[str]]:
    """The report's figures as measurements (status restored from each verdict) and its
    nodes; CalibrationError naming the field for anything of the wrong shape."""
    if not isinstance(report, dict):
        raise CalibrationError(
            "report", "expected a JSON object (the output of `aicluster doctor -o json`)"
        )
    checks = report.get("checks")
    if not isinstance(checks, list):
        raise CalibrationError(
            "checks", "missing or not a list: not an `aicluster doctor -o json` report"
        )
    nodes = report.get("nodes", [])
    if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
        raise CalibrationError("nodes", "must be a list of node ids")
    found = []
    for i, c in enumerate(checks):
        where = f"checks.{i}"
        if not isinstance(c, dict):
            raise CalibrationError(where, f"must be an object, not {c!r:.60}")
        check = c.get("check")
        if check not in dr.CHECKS:
            known = ", ".join(dr.CHECKS)
            raise CalibrationError(f"{where}.check", f"unknown check {check!r}; known: {known}")
        value = c.get("value")
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise CalibrationError(f"{where}.value", f"must be a number or null, not {value!r}")
        verdict = c.get("verdict", dr.NA if value is None else dr.UNJUDGED)
        if verdict not in VERDICTS:
            raise CalibrationError(
                f"{where}.verdict", f"{verdict!r} is none of {', '.join(VERDICTS)}"
            )
        unit = c.get("unit") or dr.CHECKS[check][0]
        if check in USED and unit != dr.CHECKS[check][0]:
            raise CalibrationError(
                f"{where}.unit", f"{check} is measured in {dr.CHECKS[check][0]}, not {unit!r}"
            )
        taking_part = c.get("nodes") or 0
        if isinstance(taking_part, bool) or not isinstance(taking_part, int):
            raise CalibrationError(f"{where}.nodes", f"must be a count, not {taking_part!r}")
        if check == "p2p_node":
            continue  # derived from the pairs: judge() makes it again
        if value is None or verdict == dr.NA:
            status = dr.NA
        elif check in HEALTH:
            status = dr.FAIL if verdict == dr.FAIL else dr.OK
        else:
            status = "measured"
        found.append(
            dr.Measurement(
                check=check,
                value=None if value is None else float(value),
                unit=unit,
                node=_optional_str(c, "node", where),
                peer=_optional_str(c, "peer", where),
                status=status,
                nodes=taking_part,
            )
        )
    return found, nodes


def _scaled(
    uses: str,
    figure: str,
    values: list[float],
    datasheet: tuple[float, str],
    reference: tuple[float, str],
    before: float,
    base: float = 1.0,
) -> tuple[Calibrated, str | None]:
    """`base` x min(1, median / reference): the item, and the note of its clamp if any."""
    measured = statistics.median(values)
    ratio = measured / reference[0]
    after = base * min(1.0, ratio)
    unit = dr.CHECKS[figure][0]
    item = Calibrated(
        uses,
        figure,
        measured,
        unit,
        len(values),
        min(values),
        max(values),
        *datasheet,
        before,
        after,
        clamped=ratio > 1.0,
    )
    note = None
    if ratio > 1.0:
        note = (
            f"{figure} {measured:.4g} {unit} is {ratio:.0%} of {reference[1]} "
            f"({reference[0]:.4g} {unit}): {uses} clamped to {after:.4g}, its value at 100%"
        )
    return item, note


def _left_out(found: list[dr.Measurement], nodes: list[str]) -> tuple[set, set, list[str]]:
    """The nodes and links whose figures are not used: those the relative judgement fails
    (re-judged without the plan's expectations), with the notes that say so."""
    rel = dr.judge(found, nodes=nodes or None)
    bad_nodes = set(rel.failing_nodes)
    bad_links = {frozenset(p) for p in rel.slow_links}
    notes = []
    if bad_nodes:
        notes.append(
            f"not used: the figures of {', '.join(sorted(bad_nodes))} (failing against the "
            "other nodes or a health check: to be repaired or cordoned)"
        )
    if bad_links:
        links = ", ".join(" - ".join(sorted(p)) for p in sorted(bad_links, key=sorted))
        notes.append(f"not used: the slow links {links}")
    return bad_nodes, bad_links, notes


def usable_figures(report: dict) -> tuple[dict[str, list[dr.Measurement]], list[str]]:
    """The figures calibration may use, by check, and notes on what was left out and why."""
    found, nodes = measurements(report)
    bad_nodes, bad_links, notes = _left_out(found, nodes)
    usable: dict[str, list[dr.Measurement]] = {}
    skipped: dict[str, int] = {}
    for m in found:
        if m.check not in USED:
            continue
        left_out = m.node in bad_nodes or m.peer in bad_nodes
        left_out |= m.peer is not None and frozenset((m.node, m.peer)) in bad_links
        if m.status != "measured" or m.value is None or m.value <= 0:
            skipped[m.check] = skipped.get(m.check, 0) + 1
        elif not left_out:
            usable.setdefault(m.check, []).append(m)
    if skipped:
        listed = ", ".join(f"{k} x{n}" for k, n in skipped.items())
        notes.append(f"not measured (not_applicable, null or 0): {listed}")
    unused = sorted({m.check for m in found if m.check not in USED and m.check not in HEALTH})
    if unused:
        notes.append(f"no planner counterpart, not used: {', '.join(unused)}")
    if "allreduce_busbw" in usable and (bad_nodes or bad_links):
        del usable["allreduce_busbw"]
        notes.append(
            "allreduce_busbw not used: an all-reduce may have included the nodes or links "
            "left out (the probe reduces over the first k ranks; the report does not say "
            "which); p2p_bw between the other nodes stands in"
        )
    if "allreduce_busbw" in usable:  # a training gang's sync is the widest all-reduce
        most = max(m.nodes for m in usable["allreduce_busbw"])
        usable["allreduce_busbw"] = [m for m in usable["allreduce_busbw"] if m.nodes == most]
    return usable, notes


def calibrate(inputs: PlanInputs, report: dict) -> tuple[PlanInputs, Calibration]:
    """The inputs with measured efficiencies and storage figures, and what changed."""
    usable, notes = usable_figures(report)
    values = {check: [m.value for m in ms] for check, ms in usable.items()}
    a, storage = inputs.assumptions, inputs.storage
    requests = (*inputs.serve, *inputs.train)
    if not requests:
        raise CalibrationError("checks", "the plan has no workload to calibrate")
    gpu, node = requests[0].gpu, inputs.node_of[requests[0].name]
    others = sorted({r.gpu.key for r in requests} - {gpu.key})
    if others:
        notes.append(
            f"figures set against {gpu.key}'s datasheet; {', '.join(others)} get the same "
            "efficiencies (the report names no GPU model)"
        )
    found: list[tuple[Calibrated, str | None]] = []
    net = "allreduce_busbw" if "allreduce_busbw" in values else "p2p_bw"
    if net in values:
        port = (inputs.network.gb_s, f"{inputs.network.key} one port {inputs.network.gb_s:g} GB/s")
        ref = (port[0], "the datasheet")
        found.append(
            _scaled("network_efficiency", net, values[net], port, ref, a.network_efficiency)
        )
    if "gpu_mem_bw" in values:
        bw = gpu.memory_bandwidth_gb_s
        sheet, ref = (bw, f"{gpu.key} {bw:g} GB/s"), (bw, "the datasheet")
        found.append(
            _scaled(
                "bandwidth_efficiency",
                "gpu_mem_bw",
                values["gpu_mem_bw"],
                sheet,
                ref,
                a.bandwidth_efficiency,
            )
        )
    if "gpu_matmul" in values:
        tf = gpu.bf16_tflops
        sheet = (tf, f"{gpu.key} bf16 {tf:g} TFLOPS; healthy floor x {MATMUL_EFFICIENCY:g}")
        ref = (tf * MATMUL_EFFICIENCY, "the healthy floor (the MFU table's GPUs reach it)")
        mm = values["gpu_matmul"]
        found.append(_scaled("mfu_scale", "gpu_matmul", mm, sheet, ref, a.mfu_scale))
        pre = a.prefill_efficiency
        found.append(_scaled("prefill_efficiency", "gpu_matmul", mm, sheet, ref, pre, pre))
    nic = inputs.node_network_gb_s(node)
    for figure, attr in (("storage_read", "read_gb_s"), ("storage_write", "write_gb_s")):
        if figure in values:
            agg = getattr(storage, attr)
            bound = min(agg, nic)
            sheet = (agg, f"{storage.key} {agg:g} GB/s aggregate; one node's bound {bound:g}")
            ref = (bound, "one node's bound min(aggregate, its NICs)")
            found.append(_scaled(f"storage.{attr}", figure, values[figure], sheet, ref, agg, agg))
    if not found:
        raise CalibrationError(
            "checks",
            f"no usable figure: none of {', '.join(USED)} was measured on a node the report "
            "does not fail",
        )
    items = tuple(item for item, _ in found)
    notes += [note for _, note in found if note]
    changes = {i.uses: i.after for i in items if not i.uses.startswith("storage.")}
    store = {
        i.uses.removeprefix("storage."): i.after for i in items if i.uses.startswith("storage.")
    }
    calibrated = replace(
        inputs,
        assumptions=replace(a, **changes),
        storage=replace(storage, **store) if store else storage,
    )
    return calibrated, Calibration(items, tuple(notes))
