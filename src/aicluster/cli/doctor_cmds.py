"""`aicluster doctor`: acceptance tests of the cluster itself, run as a platform job.

    aicluster doctor [--nodes A,B,C] [--expect plan.yaml] [-o table|json|html]
                     [--cordon-failing] [--timeout S]

It submits one job of one worker per node (`python -m aicluster.runtime.doctor_probe`),
waits for it, reads the probe's `DOCTOR {...}` lines from every rank's log, judges them
(core.doctor: against the plan's hardware with `--expect`, and relative to the other
nodes always), prints the report and exits 1 when a check fails (0 otherwise).

One worker per node, on exactly the chosen nodes: the job spec pins the gang to them
(`nodes:`, a hard constraint: no other node is ever used) and each worker asks for a
whole node (its CPUs, GPUs and GPU model), so no two workers can share one and every
chosen node gets one rank. The nodes must all have that one shape (name nodes of one
shape with --nodes otherwise), and the job waits until they are idle — a busy node's
figures would mislead anyway. The report names the nodes it measured, and says which
chosen ones sent no figures.

Invariants:
- Bad options exit 2 naming the option (before anything is submitted); a failed API
  call exits 1; never a traceback.
- `--cordon-failing` cordons only nodes with a failing node-level check (core.doctor),
  never a node named only by a slow link between healthy nodes; without it nothing
  changes on the cluster but the doctor job and its checkpoint artifact (deleted after).
- `--inject-delay` (hidden) is passed to the probe as given: a self-test of the verdicts.
"""

from __future__ import annotations

import html
import secrets
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from aicluster.cli import output as out
from aicluster.cli.common import TokenOpt, UrlOpt, cli_errors, make_client
from aicluster.client import artifacts
from aicluster.client.api import TERMINAL, ApiError, Client, node_action
from aicluster.core import doctor as dr
from aicluster.planner.assumptions import MATMUL_EFFICIENCY

# gpu_matmul's floor is MATMUL_EFFICIENCY of the datasheet (planner.assumptions, shared
# with `aicluster plan --calibrate`); the other floors are the plan's own assumptions
# (`network_efficiency`, `bandwidth_efficiency`).


def SizeOpt(name: str, what: str):  # reads as the typer.Option it returns
    return typer.Option(name, min=1024, max=1 << 30, help=f"bytes of the probe's test ({what})")


class DoctorOutput(str, Enum):
    table = "table"
    json = "json"
    html = "html"


def _bad(option: str, message: str) -> typer.Exit:
    out.print_error(f"error: {option}: {message}")
    return typer.Exit(2)


def expectations(path: Path) -> dict[str, dr.Expectation]:
    """What the plan's hardware should reach, per check (SpecError for a bad plan)."""
    from aicluster.cli.plan_cmds import load_plan

    spec, inputs = load_plan(path)
    a = inputs.assumptions
    node = next(iter(inputs.node_of.values()), None)
    found: dict[str, dr.Expectation] = {}
    if node is not None:
        # one rank per node drives one GPU and so one NIC (NCCL pairs a GPU with its
        # nearest NIC): the network figures are judged against one port's line rate
        nic, port = inputs.node_network_gb_s(node), inputs.network.gb_s
        eff = a.network_efficiency
        src = f"{inputs.network.key} one port {port:g} GB/s x network_efficiency {eff:g}"
        for check in ("p2p_bw", "allreduce_busbw"):
            found[check] = dr.Expectation(check, port * eff, src)
        st = inputs.storage
        for check, gb_s in (("storage_write", st.write_gb_s), ("storage_read", st.read_gb_s)):
            bound = min(gb_s, nic)
            found[check] = dr.Expectation(
                check, bound * eff, f"min({st.key} {gb_s:g}, NIC {nic:g}) GB/s x {eff:g}"
            )
        gpu = inputs.catalog.get("gpus", node.gpu) if inputs.catalog else None
        if gpu is not None:
            found["gpu_matmul"] = dr.Expectation(
                "gpu_matmul",
                gpu.bf16_tflops * MATMUL_EFFICIENCY,
                f"{gpu.key} bf16 {gpu.bf16_tflops:g} TFLOPS x {MATMUL_EFFICIENCY:g}",
            )
            bw, beff = gpu.memory_bandwidth_gb_s, a.bandwidth_efficiency
            found["gpu_mem_bw"] = dr.Expectation(
                "gpu_mem_bw", bw * beff, f"{gpu.key} {bw:g} GB/s x bandwidth_efficiency {beff:g}"
            )
    return found


def choose_nodes(rows: list[dict], wanted: list[str] | None) -> list[dict]:
    """The nodes to measure: the named ones (name or id prefix), else every Ready node
    with CPUs; typer.Exit(2) naming --nodes when one is unknown or shapes differ."""
    usable = [n for n in rows if n.get("alive") and not n.get("is_head") and n.get("cpus")]
    if wanted:
        chosen = []
        for name in wanted:
            hits = [n for n in rows if n["name"] == name or n["node_id"].startswith(name)]
            if len(hits) != 1:
                why = "matches no node" if not hits else "matches more than one node"
                raise _bad("--nodes", f"{name!r} {why} (see `aicluster nodes`)")
            if hits[0] not in usable:
                raise _bad("--nodes", f"{name!r} is not a live node with CPUs")
            if hits[0].get("state") != "Ready":
                raise _bad("--nodes", f"{name!r} is {hits[0].get('state')}: it takes no job")
            if hits[0] not in chosen:
                chosen.append(hits[0])
    else:
        chosen = [n for n in usable if n.get("state") == "Ready"]
        if not chosen:
            raise _bad("--nodes", "no Ready node with CPUs to measure")
    shapes = {(n["pool"], n["cpus"], n["gpus"], n.get("gpu_model")) for n in chosen}
    if len(shapes) > 1:
        listed = ", ".join(f"{p}: {c:g} CPU, {g} GPU {m or ''}".strip() for p, c, g, m in shapes)
        raise _bad(
            "--nodes",
            f"the nodes have different shapes ({listed}); doctor runs one worker per "
            "whole node: name nodes of one shape",
        )
    return chosen


def job_spec(name: str, nodes: list[dict], probe_args: list[str]) -> dict:
    n = nodes[0]
    resources: dict = {"cpus": n["cpus"]}
    if n["gpus"]:
        resources["gpus"] = n["gpus"]
    if n.get("gpu_model"):
        resources["gpu_model"] = n["gpu_model"]
    return {
        "kind": "job",
        "name": name,
        "workers": len(nodes),
        "nodes": [n["node_id"] for n in nodes],  # pinned: the ranks land on exactly these
        "resources": resources,
        "command": ["python", "-m", "aicluster.runtime.doctor_probe", *probe_args],
    }


def rank_logs(c: Client, job: dict) -> list[str]:
    texts = []
    for rank in range(job["workers"]):
        chunks, offset = [], 0
        while True:
            data, offset, _, _ = c.logs(job["id"], rank=rank, offset=offset)
            if not data:
                break
            chunks.append(data)
        texts.append(b"".join(chunks).decode(errors="replace"))
    return texts


def run(c: Client, nodes: list[dict], probe_args: list[str], timeout: float) -> dict:
    """Submit and wait: the finished job (ApiError unless it SUCCEEDED). Deletes the
    checkpoint artifact its ranks pushed to."""
    name = f"doctor-{secrets.token_hex(3)}"
    job = c.submit(job_spec(name, nodes, probe_args))
    out.console(stderr=True).print(
        f"doctor job {job['id']} on {len(nodes)} whole nodes; waiting (at most {timeout:g} s)"
    )
    try:
        job = c.wait(job["id"], TERMINAL, timeout=timeout)
    except TimeoutError:
        c.cancel(job["id"])
        raise ApiError(0, f"the doctor job {job['id']} did not end within {timeout:g} s; "
                       "cancelled (are the nodes busy? see `aicluster describe`)") from None  # fmt: skip
    finally:
        forget(c, f"{job['team']}/{name}-ckpt")
    if job["status"] != "SUCCEEDED":
        logs = rank_logs(c, job)
        tail = "\n".join(f"rank {r}: {t[-1500:]}" for r, t in enumerate(logs))
        raise ApiError(0, f"the doctor job {job['id']} is {job['status']}: {job.get('message')}"
                       f"\n{tail}")  # fmt: skip
    return job


def forget(c: Client, artifact: str) -> None:
    """Delete every version the probe pushed (its blobs go with the next gc)."""
    try:
        versions = artifacts.describe(c, artifact).get("versions") or []
    except ApiError:
        return  # no rank pushed (it failed early)
    for v in versions:  # version numbers, or version records
        try:
            artifacts.delete(c, f"{artifact}:{v['version'] if isinstance(v, dict) else v}")
        except ApiError:
            pass  # gone already


def judged(c: Client, job_id: str, expected: dict[str, dr.Expectation]) -> dict:
    """The control plane judges the job's logs and stores the report (control.doctor)."""
    body = {
        "job_id": job_id,
        "expect": {
            k: {"value": e.value, "source": e.source, "higher": e.higher}
            for k, e in expected.items()
        },
    }
    return c.request_json("POST", "/v1/doctor/reports", json=body)


def _fmt(v: dict) -> str:
    if v.get("value") is None:
        return "-"
    return f"{v['value']:.4g} {v.get('unit') or ''}".strip()


def _who(v: dict, names: dict[str, str]) -> str:
    if v.get("node") is None:
        return f"{v['nodes']} nodes" if v.get("nodes") else "cluster"
    who = names.get(v["node"], v["node"][:12])
    if (v.get("extra") or {}).get("gpu") is not None:
        who += f" gpu{v['extra']['gpu']}"
    return f"{who} - {names.get(v['peer'], v['peer'][:12])}" if v.get("peer") else who


STYLE = {dr.OK: "green", dr.WARN: "yellow", dr.FAIL: "red", dr.NA: "dim", dr.UNJUDGED: "dim"}


def print_table(report: dict, names: dict[str, str]) -> None:
    from rich.text import Text

    rows = [
        {
            "CHECK": v["check"],
            "WHERE": _who(v, names),
            "VALUE": _fmt(v),
            "VERDICT": Text(v["verdict"], style=STYLE.get(v["verdict"], "")),
            "WHY": v["reason"],
        }
        for v in report["checks"]
    ]
    out.print_table(rows, [(h, h) for h in ("CHECK", "WHERE", "VALUE", "VERDICT", "WHY")])
    failing = ", ".join(names.get(n, n) for n in report["failing_nodes"]) or "none"
    links = ", ".join(f"{names.get(a, a)} - {names.get(b, b)}" for a, b in report["slow_links"])
    out.console().print(f"verdict: {report['verdict']}; failing nodes: {failing}")
    if links:
        out.console().print(f"slow links (between healthy nodes): {links}")


def html_report(report: dict, names: dict[str, str]) -> str:
    esc = html.escape
    rows = "".join(
        f"<tr class={esc(v['verdict'])}><td>{esc(v['check'])}</td><td>{esc(_who(v, names))}"
        f"</td><td>{esc(_fmt(v))}</td><td>{esc(v['verdict'])}</td><td>{esc(v['reason'])}</td>"
        "</tr>\n"
        for v in report["checks"]
    )
    failing = ", ".join(names.get(n, n) for n in report["failing_nodes"]) or "none"
    return (
        "<!doctype html><meta charset=utf-8><title>aicluster doctor</title>"
        "<style>td,th{padding:2px 8px;text-align:left}.fail{color:#b00}.warn{color:#a60}"
        ".ok{color:#070}.not_applicable,.unjudged{color:#777}</style>\n"
        f"<h1>aicluster doctor: {esc(report['verdict'])}</h1>\n"
        f"<p>job {esc(str(report.get('job_id')))}; failing nodes: {esc(failing)}</p>\n<table>"
        "<tr><th>check<th>where<th>value<th>verdict<th>why</tr>\n"
        f"{rows}</table>\n"
    )


def doctor(
    nodes: Annotated[
        str | None,
        typer.Option(
            "--nodes", help="comma-separated node names or ids (default: every Ready node)"
        ),
    ] = None,
    expect: Annotated[
        Path | None,
        typer.Option("--expect", help="a `kind: plan` file: judge against its hardware"),
    ] = None,
    output: Annotated[
        DoctorOutput, typer.Option("--output", "-o", help="table, json or html")
    ] = DoctorOutput.table,
    cordon_failing: Annotated[
        bool, typer.Option("--cordon-failing", help="cordon the nodes that fail a check")
    ] = False,
    timeout: Annotated[
        float, typer.Option("--timeout", min=10, max=86400, help="seconds to wait for the job")
    ] = 900.0,
    p2p_bytes: Annotated[int, SizeOpt("--p2p-bytes", "per node pair")] = 4 << 20,
    allreduce_bytes: Annotated[int, SizeOpt("--allreduce-bytes", "largest")] = 16 << 20,
    storage_bytes: Annotated[int, SizeOpt("--storage-bytes", "per node")] = 32 << 20,
    inject_delay: Annotated[
        list[str] | None, typer.Option("--inject-delay", hidden=True, help="NODE_ID:MS")
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Acceptance tests of the cluster: network, storage, CPU and GPU figures per node,
    each with a verdict (README: aicluster doctor)."""
    wanted = [n.strip() for n in nodes.split(",") if n.strip()] if nodes is not None else None
    if nodes is not None and not wanted:
        raise _bad("--nodes", "give at least one node name or id")
    for item in inject_delay or ():
        name, _, ms = item.rpartition(":")
        try:
            ok = bool(name) and 0 <= float(ms) <= 10_000
        except ValueError:
            ok = False
        if not ok:
            raise _bad("--inject-delay", f"{item!r}: expected NODE_ID:MS with 0 <= MS <= 10000")
    with cli_errors():
        expected = expectations(expect) if expect is not None else {}
        with make_client(url, token) as c:
            if c.whoami().get("role") != "admin":  # before taking whole nodes for nothing
                raise ApiError(403, "aicluster doctor needs an admin token")
            chosen = choose_nodes(c.nodes(), wanted)
            args = [
                f"--p2p-bytes={p2p_bytes}",
                f"--allreduce-bytes={allreduce_bytes}",
                f"--storage-bytes={storage_bytes}",
            ]
            args += [f"--inject-delay={d}" for d in inject_delay or ()]
            job = run(c, chosen, args, timeout)
            stored = judged(c, job["id"], expected)
            report = stored["report"]
            names = {n["node_id"]: n["name"] for n in c.nodes()}
            cordoned = []
            if cordon_failing:
                for node_id in report["failing_nodes"]:
                    node_action(c, node_id, "cordon")
                    cordoned.append(node_id)
    measured = report["nodes"]
    skipped = [n["node_id"] for n in chosen if n["node_id"] not in measured]
    body = {**report, "report_id": stored["id"], "not_measured": skipped, "cordoned": cordoned}
    if output == DoctorOutput.json:
        out.print_json(body)
    elif output == DoctorOutput.html:
        typer.echo(html_report(report, names))
    else:
        print_table(report, names)
        if skipped:
            out.print_error(
                "chosen but not measured (no figures came from them): "
                + ", ".join(names.get(n, n) for n in skipped)
            )
        for node_id in cordoned:
            out.console().print(f"cordoned {names.get(node_id, node_id)}")
    if report["verdict"] == dr.FAIL:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command()(doctor)
