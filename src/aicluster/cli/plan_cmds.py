"""`aicluster plan FILE`: size a cluster from a `kind: plan` spec; `register(app)` adds it.

Invariants:
- The planner (spec, catalog, arithmetic, reports) is `aicluster.planner`; this module
  reads files, talks to the API (only with --cluster) and prints.
- A bad spec (shape, unknown catalog name, incomplete override) prints every issue with
  its field and line in red on stderr and exits 2; a failed API call exits 1.
- `--calibrate doctor.json` plans with the figures `aicluster doctor -o json` measured
  (planner.calibrate); a bad report exits 2 with `error: --calibrate: FIELD: ...`, and the
  plan's `calibration` section names every figure replaced, measured and datasheet.
- `-o json` prints the plan dict alone on stdout; `--report PATH` writes Markdown, or HTML
  when PATH ends in .html/.htm, and says so on stderr.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.table import Table
from rich.text import Text

from aicluster.cli import output as out
from aicluster.cli.config import load_client_config
from aicluster.client import ApiError, Client
from aicluster.planner import report as rep
from aicluster.planner.calibrate import CalibrationError, calibrate
from aicluster.planner.catalog import load_catalog
from aicluster.planner.inputs import PlanInputError, resolve
from aicluster.planner.inventory import fit_inventory
from aicluster.planner.plan import make_plan, plan_to_dict
from aicluster.planner.spec import PlanSpec, load_plan_spec
from aicluster.specs import SpecError
from aicluster.specs.errors import SpecIssue
from aicluster.specs.loader import _line_of, _lines

SEVERITY_STYLE = {"error": "red", "warning": "yellow", "info": "dim"}


class PlanOutput(str, Enum):
    table = "table"
    json = "json"
    markdown = "markdown"
    html = "html"


@contextmanager
def _errors() -> Iterator[None]:
    """A bad spec exits 2, a failed API call 1, Ctrl-C 130; never a traceback."""
    try:
        yield
    except SpecError as err:
        out.print_error(str(err))
        raise typer.Exit(2) from None
    except ApiError as err:
        hint = "\n  (pass --token or set AICLUSTER_TOKEN)" if err.status_code == 401 else ""
        out.print_error(f"error: cannot read the cluster inventory: {err.message}{hint}")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def _lines_of(path: Path) -> dict:
    try:
        node = yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except (OSError, yaml.YAMLError):
        return {}
    return _lines(node) if node is not None else {}


def load_plan(path: Path) -> tuple[PlanSpec, object]:
    """The spec and its resolved inputs; SpecError for anything wrong in the file."""
    spec = load_plan_spec(path)  # a job file: "kind: unknown kind; expected one of: plan"
    try:
        return spec, resolve(spec, load_catalog())
    except PlanInputError as err:
        lines = _lines_of(path)
        issues = []
        for field, message in err.issues:
            loc = tuple(int(p) if p.isdigit() else p for p in field.split("."))
            issues.append(SpecIssue(field, message, _line_of(lines, loc)))
        issues.sort(key=lambda i: i.line or 0)  # in the order of the file
        raise SpecError(str(path), issues) from None


def read_calibration(path: Path) -> dict:
    """The parsed `aicluster doctor -o json` report; typer.Exit(2) naming --calibrate."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise _bad_calibration(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise _bad_calibration(f"{path}: not a text file") from None
    except json.JSONDecodeError as exc:
        raise _bad_calibration(
            f"{path}: not JSON ({exc.msg} at line {exc.lineno}); "
            "expected the output of `aicluster doctor -o json`"
        ) from None


def _bad_calibration(message: str) -> typer.Exit:
    out.print_error(f"error: --calibrate: {message}")
    return typer.Exit(2)


def _print_rows(title: str, rows: list[dict]) -> None:
    if not rows:
        return
    table = Table(title=title, title_justify="left", header_style="bold", box=None, pad_edge=False)
    for head in rows[0]:
        table.add_column(head, overflow="fold")
    for row in rows:
        table.add_row(*(Text(str(v)) for v in row.values()))
    out.console().print(table)
    out.console().print()


def print_plan(d: dict) -> None:
    con = out.console()
    con.print(Text(f"Plan {d['name']}", style="bold"))
    if d.get("description"):
        con.print(Text(d["description"]))
    con.print()
    _print_rows("Serving", rep.serve_rows(d))
    _print_rows("Training", rep.train_rows(d))
    _print_rows("Cluster", [{"": k, "value": v} for k, v in rep.cluster_rows(d)])
    if d.get("calibration"):
        _print_rows(f"Calibration (from {d['calibration']['source']})", rep.calibration_rows(d))
        for note in d["calibration"]["notes"]:
            con.print(Text(f"  note: {note}", style="dim"))
        con.print()
    con.print(Text("Pitfalls", style="bold"))
    for p in d["pitfalls"] or [
        {"severity": "info", "code": "none", "workload": None, "message": "none found"}
    ]:
        line = Text(f"  {p['severity']:<7} ", style=SEVERITY_STYLE.get(p["severity"], ""))
        line.append(
            f"{p['code']}" + (f" ({p['workload']})" if p["workload"] else "") + f": {p['message']}"
        )
        con.print(line)
    if d.get("warnings"):
        con.print()
        con.print(Text("Warnings (implausible inputs)", style="bold"))
        for w in d["warnings"]:
            line = Text("  warning ", style=SEVERITY_STYLE["warning"])
            line.append(f"{w['field']}: {w['message']}")
            con.print(line)


def print_cluster_fit(fit: dict) -> None:
    con = out.console()
    con.print()
    con.print(
        Text(
            f"Against the running cluster: {fit['nodes']} GPU nodes, {fit['free_gpus']} free GPUs",
            style="bold",
        )
    )
    rows = []
    for s in fit["serve"]:
        where = ", ".join(f"{p['node']}x{p['replicas']}" for p in s.get("placement", [])) or "-"
        rows.append(
            {
                "workload": s["name"],
                "fits": "yes" if s["fits"] else "no",
                "gpu": s.get("gpu", "-"),
                "tp": str(s.get("tensor_parallel", "-")),
                "replicas": f"{s.get('replicas_placed', 0)}/{s.get('replicas_needed', '-')}",
                "where": where,
                "why not": s.get("reason") or "",
            }
        )
    for t in fit["train"]:
        rows.append(
            {
                "workload": t["name"],
                "fits": "yes" if t["fits"] else "no",
                "gpu": t.get("gpu", "-"),
                "tp": t.get("strategy") or "-",
                "replicas": f"{t.get('gpus', '-')} GPUs",
                "where": rep.duration(t["days"] * 86400) if "days" in t else "-",
                "why not": t.get("reason") or "",
            }
        )
    _print_rows("", rows)
    for note in fit["notes"]:
        con.print(Text(f"  note: {note}", style="dim"))


def plan(
    file: Annotated[Path, typer.Argument(help="plan spec (YAML, kind: plan)", show_default=False)],
    output: Annotated[
        PlanOutput, typer.Option("--output", "-o", help="table, json, markdown or html")
    ] = PlanOutput.table,
    report: Annotated[
        Path | None,
        typer.Option("--report", help="write a report (.html, else Markdown)"),
    ] = None,
    cluster: Annotated[
        bool,
        typer.Option("--cluster", help="also fit the workloads into the running cluster"),
    ] = False,
    url: Annotated[str | None, typer.Option("--url", help="API URL (with --cluster)")] = None,
    token: Annotated[str | None, typer.Option("--token", help="API token (with --cluster)")] = None,
    calibrate_from: Annotated[
        Path | None,
        typer.Option(
            "--calibrate",
            help="an `aicluster doctor -o json` report: plan with its measured figures",
        ),
    ] = None,
) -> None:
    """Size a cluster: memory, parallelism, replicas, network, storage, power, cost."""
    doctor_report = read_calibration(calibrate_from) if calibrate_from is not None else None
    with _errors():
        _, inputs = load_plan(file)
        calibration = None
        if doctor_report is not None:
            try:
                inputs, calibration = calibrate(inputs, doctor_report)
            except CalibrationError as err:
                raise _bad_calibration(f"{calibrate_from}: {err}") from None
        d = plan_to_dict(make_plan(inputs))
        if calibration is not None:
            d["calibration"] = {"source": str(calibrate_from), **calibration.to_dict()}
        if cluster:
            cfg = load_client_config(url, token)
            with Client(cfg.url, cfg.token) as c:
                nodes = c.nodes()
            d["cluster"] = fit_inventory(inputs, nodes, inputs.catalog)
        if report is not None:
            text = (
                rep.html_report(d)
                if report.suffix.lower() in (".html", ".htm")
                else rep.markdown(d)
            )
            try:
                report.write_text(text, encoding="utf-8")
            except OSError as exc:
                out.print_error(f"cannot write {report}: {exc.strerror}")
                raise typer.Exit(1) from None
            out.console(stderr=True).print(Text(f"report written to {report}"))
        if output is PlanOutput.json:
            out.print_json(d)
        elif output is PlanOutput.markdown:
            typer.echo(rep.markdown(d))
        elif output is PlanOutput.html:
            typer.echo(rep.html_report(d))
        else:
            print_plan(d)
            if cluster:
                print_cluster_fit(d["cluster"])


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)
