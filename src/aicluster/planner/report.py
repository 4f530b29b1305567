"""Plan reports: Markdown and HTML, with charts drawn as inline SVG (no plotting library).

Input is the dict from `aicluster.planner.plan.plan_to_dict`, so a report can be made
from saved `-o json` output too. Charts: memory per GPU by kind (stacked bars), serving
capacity against replicas (with the demand as a line), training days against nodes, and
capital cost by part. Text is escaped; numbers are formatted, never interpreted.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1")


# --- formatting --------------------------------------------------------------------


def gb(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e9:,.1f} GB"


def kib(x: float | None) -> str:
    return "-" if x is None else f"{x / 1024:,.0f} KiB"


def num(x: float | None, digits: int = 2) -> str:
    if x is None:
        return "-"
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if abs(x) >= div:
            return f"{x / div:.{digits}f}{unit}"
    return f"{x:,.{digits}f}".rstrip("0").rstrip(".")


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:,.0f} ms" if x >= 0.01 else f"{x * 1000:.1f} ms"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def usd(x: float | None) -> str:
    return "-" if x is None else f"${x:,.0f}"


# --- rows shared by the terminal, Markdown and HTML --------------------------------


def serve_rows(d: dict) -> list[dict]:
    rows = []
    for s in d["serve"]:
        c = s["chosen"] or {}
        demand = s["demand"]
        rows.append(
            {
                "workload": s["name"],
                "model": f"{s['model']} ({s['precision']})",
                "weights": gb(s["weight_bytes"]),
                "kv/token": kib(s["kv_bytes_per_token"]),
                "tp x pp": f"{c.get('tensor_parallel', '-')} x {c.get('pipeline_parallel', '-')}"
                + (f" (ep {c['expert_parallel']})" if c.get("expert_parallel", 1) > 1 else "")
                if c
                else "does not fit",
                "batch": str(c.get("batch", "-")),
                "TTFT": ms(c.get("ttft_s")),
                "TPOT": ms(c.get("tpot_s")),
                "req/s per replica": num(c.get("replica_requests_per_s")),
                "demand": f"{num(demand['requests_per_second'])} req/s"
                if demand["requests_per_second"]
                else f"{demand['concurrent_users'] or '-'} users",
                "replicas": str(c.get("replicas", "-")),
                "GPUs": str(c.get("total_gpus", "-")),
                "nodes": str(s["nodes"]),
            }
        )
    return rows


def train_rows(d: dict) -> list[dict]:
    rows = []
    for t in d["train"]:
        lay = t["layout"] or {}
        mem = (lay.get("memory_per_gpu_bytes") or {}).get("total")
        layout = "-"
        if lay:
            layout = f"{lay['strategy']} dp{lay['data_parallel']} tp{lay['tensor_parallel']} pp{lay['pipeline_parallel']}"
            for key, short in (("context_parallel", "cp"), ("expert_parallel", "ep")):
                if lay.get(key, 1) > 1:
                    layout += f" {short}{lay[key]}"
        rows.append(
            {
                "workload": t["name"],
                "model": f"{t['model']} ({t['method']})",
                "trainable": num(t["trainable_params"]),
                "tokens": num(t["tokens"]),
                "FLOPs": f"{t['total_flops']:.2e}",
                "MFU": f"{t['mfu']:.0%}" if t.get("mfu") else "-",
                "GPUs": f"{t['gpus']} ({t['nodes']} nodes)",
                "layout": layout,
                "mem/GPU": f"{gb(mem)} of {gb(lay.get('gpu_memory_bytes'))}" if lay else "-",
                "time": duration(t["seconds"]) if t["seconds"] is not None else "does not fit",
                "comm/compute": f"{t['step_comm_s'] / t['step_compute_s']:.0%}"
                if t["nodes"] > 1
                else "-",
                "net needed": f"{t['break_even_gbit_s_per_node']:,.0f} Gb/s/node"
                if t["nodes"] > 1
                else "-",
                "checkpoint": f"{gb(t['checkpoint_bytes'])}, {duration(t['checkpoint_write_s'])}",
            }
        )
    return rows


def calibration_rows(d: dict) -> list[dict]:
    """`--calibrate`: each planner figure replaced, the measurement and the datasheet."""
    rows = []
    for c in (d.get("calibration") or {}).get("items", []):
        spread = f" ({c['low']:.4g}-{c['high']:.4g})" if c["samples"] > 1 else ""
        rows.append(
            {
                "uses": c["uses"],
                "was": f"{c['before']:.4g}",
                "now": f"{c['after']:.4g}" + (" (clamped)" if c["clamped"] else ""),
                "measured": f"{c['figure']} {c['measured']:.4g} {c['unit']}, median of "
                f"{c['samples']}{spread}",
                "datasheet": f"{c['datasheet']:.4g} {c['unit']} ({c['datasheet_source']})",
            }
        )
    return rows


def cluster_rows(d: dict) -> list[tuple[str, str]]:
    t, net = d["totals"], d["network"]
    pools = ", ".join(f"{p['nodes']} x {p['node']} for {p['role']}" for p in d["pools"])
    rows = [
        ("topology", d["topology"]),
        ("nodes", f"{t['nodes']} ({pools})"),
        ("GPUs", f"{t['gpus']} ({t['gpus_used']} used by the workloads)"),
        (
            "network",
            f"{net['name']}: {net['ports']} ports, {net['leaf_switches']} leaf + {net['spine_switches']} spine switches",
        ),
        ("shared storage", f"{d['storage']['name']} ({d['storage']['read_gb_s']:g} GB/s read)"),
        (
            "power",
            f"{t['it_kw']:,.1f} kW IT, {t['facility_kw']:,.1f} kW facility (PUE {d['assumptions']['pue']:g})",
        ),
        ("cooling", f"{t['cooling_btu_per_hour']:,.0f} BTU/h"),
        ("racks", f"{t['racks']} at {d['assumptions']['rack_power_kw']:g} kW each"),
        (
            "capital cost",
            f"{usd(t['capex_usd'])} (nodes {usd(t['node_capex_usd'])}, network {usd(t['network_capex_usd'])})"
            + (f"; budget {usd(t['budget_usd'])}" if t["budget_usd"] else ""),
        ),
        (
            "monthly cost",
            f"{usd(t['monthly_usd'])} (energy {usd(t['energy_usd_per_month'])}, amortisation {usd(t['amortization_usd_per_month'])})",
        ),
    ]
    for s in d["serve"]:
        load = s.get("model_load")
        if load:
            rows.append(
                (
                    f"model load: {s['name']}",
                    f"{gb(load['size_bytes'])} onto {load['nodes']} node(s): {duration(load['cold_s'])} cold, {duration(load['warm_s'])} from local NVMe",
                )
            )
    return rows


# --- SVG charts --------------------------------------------------------------------


def _svg_open(w: int, h: int, title: str) -> list[str]:
    return [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
            f'font-family="sans-serif" font-size="11" role="img" aria-label="{html.escape(title)}">'
        ),
        f'<text x="{w / 2}" y="16" text-anchor="middle" font-size="13" font-weight="bold">{html.escape(title)}</text>',
    ]


def stacked_bars_svg(
    title: str,
    bars: Sequence[tuple[str, dict[str, float]]],
    unit: float = 1e9,
    unit_name: str = "GB",
) -> str:
    """One bar per label; each bar stacks its parts (dict order) in bytes."""
    w, h, left, bottom, top = 640, 300, 60, 60, 30
    keys: list[str] = []
    for _, parts in bars:
        keys += [k for k in parts if k not in keys]
    peak = max((sum(p.values()) for _, p in bars), default=1) / unit or 1
    out = _svg_open(w, h, title)
    plot_h, plot_w = h - top - bottom, w - left - 150
    step = plot_w / max(1, len(bars))
    for i in range(5):
        v = peak * i / 4
        y = top + plot_h - plot_h * i / 4
        out.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#ddd"/>'
        )
        out.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{v:,.0f}</text>')
    out.append(
        f'<text x="12" y="{top + plot_h / 2}" transform="rotate(-90 12 {top + plot_h / 2})" text-anchor="middle">{unit_name}</text>'
    )
    for i, (label, parts) in enumerate(bars):
        x, y = left + i * step + step * 0.15, top + plot_h
        for k in keys:
            v = parts.get(k, 0) / unit
            bh = plot_h * v / peak
            y -= bh
            color = PALETTE[keys.index(k) % len(PALETTE)]
            out.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{step * 0.7:.1f}" height="{bh:.1f}" fill="{color}"><title>{html.escape(k)}: {v:,.1f} {unit_name}</title></rect>'
            )
        out.append(
            f'<text x="{x + step * 0.35:.1f}" y="{top + plot_h + 14}" text-anchor="middle">{html.escape(label)}</text>'
        )
    for j, k in enumerate(keys):
        y = top + 10 + j * 16
        out.append(
            f'<rect x="{w - 140}" y="{y - 9}" width="10" height="10" fill="{PALETTE[j % len(PALETTE)]}"/>'
        )
        out.append(f'<text x="{w - 126}" y="{y}">{html.escape(k)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def line_svg(
    title: str,
    points: Sequence[tuple[float, float]],
    xlabel: str,
    ylabel: str,
    hline: float | None = None,
    hlabel: str = "",
) -> str:
    """A line through `points` (x ascending); an optional horizontal reference line."""
    w, h, left, bottom, top = 640, 280, 60, 45, 30
    if not points:
        return ""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1 = min(xs), max(xs)
    y1 = max(ys + ([hline] if hline else [])) * 1.1 or 1
    plot_w, plot_h = w - left - 20, h - top - bottom
    sx = lambda x: left + (plot_w * (x - x0) / (x1 - x0) if x1 > x0 else plot_w / 2)
    sy = lambda y: top + plot_h - plot_h * y / y1
    out = _svg_open(w, h, title)
    for i in range(5):
        v = y1 * i / 4
        out.append(
            f'<line x1="{left}" y1="{sy(v):.1f}" x2="{left + plot_w}" y2="{sy(v):.1f}" stroke="#ddd"/>'
        )
        out.append(f'<text x="{left - 4}" y="{sy(v) + 4:.1f}" text-anchor="end">{v:,.1f}</text>')
    for x in xs:
        out.append(
            f'<text x="{sx(x):.1f}" y="{top + plot_h + 14}" text-anchor="middle">{x:g}</text>'
        )
    path = " ".join(
        f"{'M' if i == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}" for i, (x, y) in enumerate(points)
    )
    out.append(f'<path d="{path}" fill="none" stroke="{PALETTE[0]}" stroke-width="2"/>')
    for x, y in points:
        out.append(
            f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{PALETTE[0]}"><title>{x:g}: {y:,.2f}</title></circle>'
        )
    if hline:
        out.append(
            f'<line x1="{left}" y1="{sy(hline):.1f}" x2="{left + plot_w}" y2="{sy(hline):.1f}" stroke="{PALETTE[3]}" stroke-dasharray="5,4"/>'
        )
        out.append(
            f'<text x="{left + plot_w - 4}" y="{sy(hline) - 4:.1f}" text-anchor="end" fill="{PALETTE[3]}">{html.escape(hlabel)}</text>'
        )
    out.append(
        f'<text x="{left + plot_w / 2}" y="{h - 8}" text-anchor="middle">{html.escape(xlabel)}</text>'
    )
    out.append(
        f'<text x="12" y="{top + plot_h / 2}" transform="rotate(-90 12 {top + plot_h / 2})" text-anchor="middle">{html.escape(ylabel)}</text>'
    )
    out.append("</svg>")
    return "\n".join(out)


def charts(d: dict) -> list[str]:
    out = []
    bars = []
    for s in d["serve"]:
        if s["chosen"]:
            bars.append((s["name"], s["chosen"]["memory_per_gpu_bytes"]))
    for t in d["train"]:
        if t["layout"]:
            mem = {k: v for k, v in t["layout"]["memory_per_gpu_bytes"].items() if k != "total"}
            bars.append((t["name"], mem))
    if bars:
        out.append(stacked_bars_svg("Memory per GPU", bars))
    for s in d["serve"]:
        pts = [(p["replicas"], p["requests_per_s"]) for p in s["throughput_curve"]]
        rate = s["demand"]["requests_per_second"]
        out.append(
            line_svg(
                f"{s['name']}: capacity against replicas",
                pts,
                "replicas",
                "requests/s (100% load)",
                rate,
                f"demand {rate:g} req/s" if rate else "",
            )
        )
    for t in d["train"]:
        pts = [(p["nodes"], p["days"]) for p in t["time_vs_nodes"] if p["days"] is not None]
        out.append(line_svg(f"{t['name']}: training time against nodes", pts, "nodes", "days"))
    t = d["totals"]
    out.append(
        stacked_bars_svg(
            "Capital cost",
            [
                ("nodes", {"nodes": t["node_capex_usd"]}),
                ("network", {"network": t["network_capex_usd"]}),
            ],
            1e3,
            "k$",
        )
    )
    return [c for c in out if c]


# --- documents ---------------------------------------------------------------------


def _md_table(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    heads = list(rows[0])
    out = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    out += ["| " + " | ".join(str(r[h]).replace("|", "\\|") for h in heads) + " |" for r in rows]
    return out + [""]


def _sources(d: dict) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    for w in (*d["serve"], *d["train"]):
        for k, v in (w.get("model_sources") or {}).items():
            seen.append((f"{w['model']} {k}", v))
    for k, v in d["network"]["sources"].items():
        seen.append((f"{d['network']['name']} {k}", v))
    for k, v in d["storage"]["sources"].items():
        seen.append((f"{d['storage']['name']} {k}", v))
    return seen


def markdown(d: dict, with_charts: bool = True) -> str:
    out = [f"# Cluster plan: {d['name']}", ""]
    if d.get("description"):
        out += [d["description"], ""]
    if d["serve"]:
        out += ["## Serving", ""] + _md_table(serve_rows(d))
    if d["train"]:
        out += ["## Training", ""] + _md_table(train_rows(d))
    out += ["## Cluster", ""] + _md_table([{"": k, "value": v} for k, v in cluster_rows(d)])
    out += ["## Pitfalls", ""]
    out += [
        f"- **{p['severity']}** `{p['code']}`"
        + (f" ({p['workload']})" if p["workload"] else "")
        + f": {p['message']}"
        for p in d["pitfalls"]
    ] or ["- none found"]
    if d.get("warnings"):
        out += ["", "## Warnings (implausible inputs)", ""]
        out += [f"- `{w['field']}`: {w['message']}" for w in d["warnings"]]
    if d.get("calibration"):
        source = d["calibration"].get("source", "a doctor report")
        out += ["", f"## Calibration (from {source})", ""]
        out += _md_table(calibration_rows(d)) + [f"- {n}" for n in d["calibration"]["notes"]]
    out += ["", "## Assumptions", ""] + [f"- `{k}` = {v}" for k, v in d["assumptions"].items()]
    out += ["", "## Sources", ""] + [f"- {k}: {v}" for k, v in _sources(d)]
    out += [
        "",
        "Formulas and their sources: docs/planner.md and the docstrings of `aicluster.planner`.",
        "",
    ]
    if with_charts:
        out += ["## Charts", ""]
        for svg in charts(d):
            out += [svg, ""]
    return "\n".join(out)


def _html_table(rows: list[dict]) -> str:
    if not rows:
        return ""
    heads = list(rows[0])
    th = "".join(f"<th>{html.escape(h)}</th>" for h in heads)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(r[h]))}</td>" for h in heads) + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def html_report(d: dict) -> str:
    e = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>Cluster plan: {e(d['name'])}</title>",
        (
            "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
            "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}"
            "th{background:#f3f3f3}.error{color:#b00}.warning{color:#a60}.info{color:#555}svg{margin:1em 0;display:block}</style>"
        ),
        f"</head><body><h1>Cluster plan: {e(d['name'])}</h1>",
    ]
    if d.get("description"):
        parts.append(f"<p>{e(d['description'])}</p>")
    if d["serve"]:
        parts += ["<h2>Serving</h2>", _html_table(serve_rows(d))]
    if d["train"]:
        parts += ["<h2>Training</h2>", _html_table(train_rows(d))]
    parts += [
        "<h2>Cluster</h2>",
        _html_table([{"": k, "value": v} for k, v in cluster_rows(d)]),
    ]
    parts.append("<h2>Pitfalls</h2><ul>")
    for p in d["pitfalls"] or [
        {"severity": "info", "code": "none", "workload": None, "message": "none found"}
    ]:
        who = f" ({e(p['workload'])})" if p["workload"] else ""
        parts.append(
            f"<li class='{e(p['severity'])}'><b>{e(p['severity'])}</b> <code>{e(p['code'])}</code>{who}: {e(p['message'])}</li>"
        )
    parts.append("</ul>")
    if d.get("warnings"):
        parts.append("<h2>Warnings (implausible inputs)</h2><ul>")
        parts += [
            f"<li class='warning'><code>{e(w['field'])}</code>: {e(w['message'])}</li>"
            for w in d["warnings"]
        ]
        parts.append("</ul>")
    parts.append("<h2>Charts</h2>")
    parts += charts(d)
    if d.get("calibration"):
        source = d["calibration"].get("source", "a doctor report")
        parts += [f"<h2>Calibration (from {e(source)})</h2>", _html_table(calibration_rows(d))]
        parts += ["<ul>", *(f"<li>{e(n)}</li>" for n in d["calibration"]["notes"]), "</ul>"]
    parts.append("<h2>Assumptions</h2><ul>")
    parts += [f"<li><code>{e(k)}</code> = {e(str(v))}</li>" for k, v in d["assumptions"].items()]
    parts.append("</ul><h2>Sources</h2><ul>")
    parts += [f"<li>{e(k)}: {e(v)}</li>" for k, v in _sources(d)]
    parts.append("</ul></body></html>")
    return "\n".join(parts)
