"""`aicluster doctor`'s judgement: measured figures in, a verdict per check out (no I/O).

Vocabulary:
- a *Measurement* is one figure the probe (runtime.doctor_probe) printed: a `check`, the
  `node` it belongs to (None: the cluster, e.g. an all-reduce), the `peer` of a pair
  check, `value` in `unit` (None with status `not_applicable`: nothing could be looked at,
  e.g. no CUDA), or a health check's own `ok`/`fail`.
- an *Expectation* is what the plan's hardware should reach for a check: the catalog's
  datasheet figure times the efficiency the plan assumed (cli.doctor_cmds builds them from
  `--expect plan.yaml`); `higher` says which way is better (latency: lower).
- a *Verdict* is ok | warn | fail | not_applicable | unjudged (measured, but nothing to
  compare it with: no expectation and no peers).

Rules:
- Against an expectation: ok at or beyond it, warn within `WARN_BAND` of it (measurement
  noise at the probe's bounded sizes), fail beyond that. The expectation already is the
  plan's own derated figure, so a fail means the plan's times are off by that much.
- Relative (always, with or without expectations): a per-node figure below `RELATIVE_FLOOR`
  of the median of the nodes fails. Pairs: a node's *best link* is its fastest pair; a
  pair below `RELATIVE_FLOOR` of the median best link fails; a node all of whose (two or
  more) pairs fail is the slow one (check `p2p_node`); a failing pair between two nodes
  that are not is a slow link. With two nodes a slow link cannot be told from a slow node.
- The worse of the absolute and the relative verdict wins.

Invariants: pure (no I/O, no clock); a not_applicable measurement is never judged ok; every
measurement gives exactly one verdict; the failing nodes are those with a failing
node-level check (never a node named only by a failing pair between healthy nodes).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

OK, WARN, FAIL, NA, UNJUDGED = "ok", "warn", "fail", "not_applicable", "unjudged"
_RANK = {NA: 0, UNJUDGED: 1, OK: 2, WARN: 3, FAIL: 4}
RELATIVE_FLOOR = 0.5
WARN_BAND = 0.2
PREFIX = "DOCTOR "  # how the probe's result lines start in the job's logs

# check -> (unit, higher is better, what it measures); the probe prints these names.
CHECKS: dict[str, tuple[str, bool, str]] = {
    "allreduce_busbw": ("GB/s", True, "all-reduce bus bandwidth at the largest size"),
    "allreduce_latency": ("us", False, "all-reduce time of the smallest size"),
    "p2p_bw": ("GB/s", True, "send/recv bandwidth of one node pair (ping-pong)"),
    "p2p_node": ("GB/s", True, "a node's best link; fails when every link of it is slow"),
    "storage_write": ("GB/s", True, "push of a blob to the artifact store"),
    "storage_read": ("GB/s", True, "pull of that blob back"),
    "cpu_mem_bw": ("GB/s", True, "host memory copy (read + write counted)"),
    "cpu_matmul": ("GFLOPS", True, "float32 matmul on the CPU"),
    "gpu_matmul": ("TFLOPS", True, "bf16 matmul per GPU"),
    "gpu_mem_bw": ("GB/s", True, "device-to-device copy per GPU (read + write counted)"),
    "gpu_nvml": ("", True, "NVML health: count, XID, temperature"),
    "gpu_ecc": ("errors", False, "uncorrected volatile ECC errors"),
    "probe_error": ("", False, "a step of the probe raised on the node"),
}
PER_NODE = (
    "storage_write",
    "storage_read",
    "cpu_mem_bw",
    "cpu_matmul",
    "gpu_matmul",
    "gpu_mem_bw",
)


@dataclass(frozen=True)
class Measurement:
    check: str
    value: float | None
    unit: str = ""
    node: str | None = None
    peer: str | None = None
    status: str = "measured"  # measured | not_applicable | ok | fail (health checks)
    detail: str = ""
    nodes: int = 0  # all-reduce: how many nodes took part
    extra: dict = field(default_factory=dict, compare=False)

    @classmethod
    def from_dict(cls, d: dict) -> Measurement:
        if not isinstance(d, dict) or d.get("check") not in CHECKS:
            raise ValueError(f"not a doctor measurement: {str(d)[:200]}")
        value = d.get("value")
        if value is not None and not isinstance(value, (int, float)):
            raise ValueError(f"{d['check']}: value must be a number, not {value!r}")
        known = {"check", "value", "unit", "node", "peer", "status", "detail", "nodes"}
        return cls(
            check=d["check"],
            value=None if value is None else float(value),
            unit=str(d.get("unit") or CHECKS[d["check"]][0]),
            node=d.get("node"),
            peer=d.get("peer"),
            status=str(d.get("status") or "measured"),
            detail=str(d.get("detail") or ""),
            nodes=int(d.get("nodes") or 0),
            extra={k: v for k, v in d.items() if k not in known},
        )


@dataclass(frozen=True)
class Expectation:
    check: str
    value: float
    source: str  # e.g. "infiniband-ndr 50 GB/s x network_efficiency 0.8"
    higher: bool = True


@dataclass(frozen=True)
class Verdict:
    check: str
    node: str | None
    peer: str | None
    value: float | None
    unit: str
    verdict: str
    reason: str
    expected: float | None = None
    nodes: int = 0
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Report:
    nodes: tuple[str, ...]
    verdicts: tuple[Verdict, ...]
    failing_nodes: tuple[str, ...]
    slow_links: tuple[tuple[str, str], ...]

    @property
    def verdict(self) -> str:
        return worst(v.verdict for v in self.verdicts) if self.verdicts else UNJUDGED

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "nodes": list(self.nodes),
            "failing_nodes": list(self.failing_nodes),
            "slow_links": [list(p) for p in self.slow_links],
            "checks": [asdict(v) for v in self.verdicts],
        }


def worst(verdicts) -> str:
    return max(verdicts, key=lambda v: _RANK[v], default=UNJUDGED)


def parse_lines(text: str) -> list[Measurement]:
    """Every `DOCTOR {...}` line of a log (other lines are ignored; a bad one raises)."""
    import json

    out = []
    for line in text.splitlines():
        if line.startswith(PREFIX):
            out.append(Measurement.from_dict(json.loads(line[len(PREFIX) :])))
    return out


def against(value: float, exp: Expectation) -> tuple[str, str]:
    """Verdict and reason of one figure against its expectation."""
    ratio = value / exp.value if exp.higher else (exp.value / value if value > 0 else 1e9)
    pct = f"{100 * ratio:.0f}% of expected {exp.value:.4g} ({exp.source})"
    if ratio >= 1.0:
        return OK, pct
    return (WARN if ratio >= 1.0 - WARN_BAND else FAIL), pct


def _relative(value: float, ref: float, higher: bool, what: str) -> tuple[str, str]:
    if ref <= 0:
        return UNJUDGED, f"no positive {what} to compare with"
    ratio = value / ref if higher else (ref / value if value > 0 else 1e9)
    text = f"{100 * ratio:.0f}% of the {what} {ref:.4g}"
    return (FAIL if ratio < RELATIVE_FLOOR else OK), text


def _combine(parts: list[tuple[str, str]]) -> tuple[str, str]:
    judged = [p for p in parts if p[0] != UNJUDGED]
    if not judged:
        return UNJUDGED, "; ".join(p[1] for p in parts if p[1]) or "nothing to compare with"
    verdict = worst(p[0] for p in judged)
    return verdict, "; ".join(p[1] for p in parts if p[1])


def judge(
    measurements: list[Measurement],
    expect: dict[str, Expectation] | None = None,
    nodes: list[str] | None = None,
) -> Report:
    """The verdict of every measurement, the failing nodes and the slow links."""
    expect = expect or {}
    measured = [m for m in measurements if m.status == "measured" and m.value is not None]
    node_ids = list(nodes or dict.fromkeys(m.node for m in measurements if m.node))
    # per-node references: the median of the nodes' figures of each check
    medians = {}
    for check in PER_NODE:
        values = [m.value for m in measured if m.check == check]
        if len(values) >= 2:
            medians[check] = statistics.median(values)
    pairs = [m for m in measured if m.check == "p2p_bw" and m.node and m.peer]
    best: dict[str, float] = {}
    for m in pairs:
        for n in (m.node, m.peer):
            best[n] = max(best.get(n, 0.0), m.value)
    link_ref = statistics.median(best.values()) if best else 0.0
    judge_links = len(best) >= 3

    out: list[Verdict] = []
    pair_fail: dict[str, list[bool]] = {}
    for m in measurements:
        unit = m.unit or CHECKS[m.check][0]
        higher = CHECKS[m.check][1]
        exp = expect.get(m.check)
        base = dict(check=m.check, node=m.node, peer=m.peer, value=m.value, unit=unit)
        base.update(nodes=m.nodes, extra=dict(m.extra))
        if m.status == NA or (m.status == "measured" and m.value is None):
            out.append(Verdict(**base, verdict=NA, reason=m.detail or "could not be measured"))
            continue
        if m.status in (OK, FAIL):  # a health check judged on the node (core.health)
            out.append(Verdict(**base, verdict=m.status, reason=m.detail))
            continue
        parts = [against(m.value, exp)] if exp else []
        if m.check in medians:
            parts.append(_relative(m.value, medians[m.check], higher, "median of the nodes"))
        elif m.check == "p2p_bw" and judge_links:
            parts.append(_relative(m.value, link_ref, True, "median best link"))
        elif m.check == "p2p_bw":
            parts.append((UNJUDGED, "two nodes: a slow link cannot be told from a slow node"))
        verdict, reason = _combine(parts)
        if m.detail:
            reason = f"{reason}; {m.detail}" if reason else m.detail
        if m.check == "p2p_bw":
            for n in (m.node, m.peer):
                pair_fail.setdefault(n, []).append(verdict == FAIL)
        out.append(
            Verdict(**base, verdict=verdict, reason=reason, expected=exp.value if exp else None)
        )

    slow_nodes = {n for n, fails in pair_fail.items() if len(fails) >= 2 and all(fails)}
    order = [n for n in node_ids if n in best] + sorted(n for n in best if n not in node_ids)
    for n in order:
        fails = pair_fail.get(n, [])
        if n in slow_nodes:
            verdict, reason = FAIL, f"all {len(fails)} of its links are slow"
        elif not judge_links:
            verdict, reason = UNJUDGED, "needs three nodes or more"
        else:
            verdict, reason = OK, f"{len(fails) - sum(fails)} of {len(fails)} links fine"
        out.append(Verdict("p2p_node", n, None, best[n], "GB/s", verdict, reason, expected=None))
    links = tuple(
        (v.node, v.peer)
        for v in out
        if v.check == "p2p_bw"
        and v.verdict == FAIL
        and v.node not in slow_nodes
        and v.peer not in slow_nodes
    )
    failing = tuple(
        n
        for n in node_ids
        if any(v.node == n and v.peer is None and v.verdict == FAIL for v in out)
    )
    return Report(tuple(node_ids), tuple(out), failing, links)
