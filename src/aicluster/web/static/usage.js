// The Usage page: GPU-hours per team per day (stacked bars), cost per team this month
// against its budget, the top jobs and services by cost, and queue wait per team over
// time (lines). Every chart is SVG built with DOM APIs (no markup strings, no inline
// style: the CSP allows neither) and every number it draws is also text: a <title> on
// each mark and a table under each chart, with the API's raw value in data-value.

import { duration, fill, h, num, route, section, table } from "./dom.js";

const SVG = "http://www.w3.org/2000/svg";
const REFRESH_MS = 15000; // ledger sums move slowly: no need to redraw at the poll rate
const PERIODS = [["7d", "7 days"], ["30d", "30 days"], ["90d", "90 days"]];
const PALETTE = ["#5aa9ff", "#3fb27f", "#d6a33a", "#c77dff", "#e0803a", "#4dd0c8", "#e5534b", "#9aa7b8"];
const W = 1200;
const H = 300;
const M = { top: 14, right: 16, bottom: 40, left: 62 };

function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) el.setAttribute(k, String(v));
  for (const c of children) if (c !== null && c !== undefined) el.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

// A number as people read it: 3 significant digits below 1, 2 decimals up to 1000.
export function fmt(x) {
  if (x === null || x === undefined || !Number.isFinite(Number(x))) return "—";
  const n = Number(x);
  const a = Math.abs(n);
  if (a === 0) return "0";
  if (a >= 1000) return String(Math.round(n));
  if (a >= 1) return n.toFixed(2);
  return String(Number(n.toPrecision(3)));
}

const money = (x) => (x === null || x === undefined ? "—" : "$" + fmt(x));

function seconds(x) {
  if (x === null || x === undefined) return "—";
  if (x < 120) return fmt(x) + " s";
  if (x < 7200) return fmt(x / 60) + " min";
  return fmt(x / 3600) + " h";
}

function day(ts) {
  const d = new Date(ts * 1000);
  return d.toISOString().slice(5, 10); // MM-DD, UTC like the buckets
}

// A "nice" axis maximum and step: 1, 2 or 5 times a power of ten.
function axis(max, ticks = 5) {
  if (!(max > 0)) return { top: 1, step: 0.2 };
  const raw = max / ticks;
  const p = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((k) => k * p).find((v) => v >= raw);
  return { top: Math.ceil(max / step - 1e-9) * step, step };
}

function frame(n, yMax, yLabel, buckets) {
  const pw = W - M.left - M.right;
  const ph = H - M.top - M.bottom;
  const { top, step } = axis(yMax);
  const digits = step >= 1 ? 0 : Math.ceil(-Math.log10(step) - 1e-9);
  const x = (i) => M.left + (pw * (i + 0.5)) / n;
  const y = (v) => M.top + ph - (ph * v) / top;
  const g = s("g", { class: "axis" });
  for (let v = 0; v <= top + step / 2; v += step) {
    g.appendChild(s("line", { x1: M.left, x2: W - M.right, y1: y(v), y2: y(v), class: "grid" }));
    g.appendChild(s("text", { x: M.left - 8, y: y(v) + 4, "text-anchor": "end" }, v.toFixed(digits)));
  }
  const every = Math.max(1, Math.ceil(n / 12));
  for (let i = 0; i < n; i += 1) {
    if ((n - 1 - i) % every) continue; // always label the newest bucket
    g.appendChild(s("text", { x: x(i), y: H - M.bottom + 16, "text-anchor": "middle" }, day(buckets[i])));
  }
  g.appendChild(s("line", { x1: M.left, x2: W - M.right, y1: y(0), y2: y(0), class: "baseline" }));
  g.appendChild(s("text", { x: 14, y: M.top + ph / 2, "text-anchor": "middle",
    transform: `rotate(-90 14 ${M.top + ph / 2})`, class: "axis-title" }, yLabel));
  g.appendChild(s("text", { x: M.left + pw / 2, y: H - 4, "text-anchor": "middle", class: "axis-title" }, "day (UTC)"));
  return { g, x, y, slot: pw / n };
}

function legend(teams, colors, values, format, testid) {
  return h("div", { class: "chart-legend", testid },
    teams.map((t) => h("span", { class: "legend-item", data: { team: t } },
      swatch(colors.get(t)), h("span", null, t),
      values ? h("span", { class: "muted" }, format(values.get(t))) : null)));
}

function swatch(color) {
  return s("svg", { width: 12, height: 12, class: "swatch" }, s("rect", { width: 12, height: 12, rx: 3, fill: color }));
}

function chartBox(svg, testid) {
  return h("div", { class: "chart", testid }, svg);
}

// Stacked bars: one column per bucket, one segment per team (sorted order, bottom up).
function stackedBars(data, colors) {
  const n = data.buckets.length;
  const sums = data.buckets.map((_, i) => data.series.reduce((acc, se) => acc + se.points[i][1], 0));
  const f = frame(n, Math.max(...sums, 0), "GPU-hours", data.buckets);
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "GPU-hours per team per day" }, f.g);
  const bw = Math.max(2, Math.min(36, f.slot * 0.7));
  for (let i = 0; i < n; i += 1) {
    let base = 0;
    for (const se of data.series) {
      const v = se.points[i][1];
      if (!v) continue;
      svg.appendChild(s("rect", {
        x: f.x(i) - bw / 2, y: f.y(base + v), width: bw, height: Math.max(1, f.y(base) - f.y(base + v)),
        fill: colors.get(se.team), class: "mark", "data-team": se.team, "data-value": v,
      }, s("title", null, `${se.team} · ${day(data.buckets[i])}: ${fmt(v)} GPU-h`)));
      base += v;
    }
  }
  return svg;
}

// One line per team through the buckets that had admissions (a gap where none had).
function lines(data, colors) {
  const n = data.buckets.length;
  const all = data.series.flatMap((se) => se.points.map((p) => p[1]).filter((v) => v !== null));
  const f = frame(n, Math.max(...all, 0), "mean wait (s)", data.buckets);
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "queue wait per team" }, f.g);
  for (const se of data.series) {
    let d = "";
    let pen = false;
    se.points.forEach(([, v], i) => {
      if (v === null) { pen = false; return; }
      d += (pen ? " L" : " M") + f.x(i).toFixed(1) + " " + f.y(v).toFixed(1);
      pen = true;
    });
    svg.appendChild(s("path", { d: d.trim(), fill: "none", stroke: colors.get(se.team), "stroke-width": 2, class: "line" }));
    se.points.forEach(([, v], i) => {
      if (v === null) return;
      const most = se.max[i][1];
      const count = se.admissions[i][1];
      svg.appendChild(s("circle", {
        cx: f.x(i), cy: f.y(v), r: 4, fill: colors.get(se.team), class: "mark", "data-team": se.team, "data-value": v,
      }, s("title", null, `${se.team} · ${day(data.buckets[i])}: mean ${seconds(v)}, max ${seconds(most)}, ${count} admitted`)));
    });
  }
  return svg;
}

function valueCell(value, text, testid) {
  return h("td", { class: "num", testid, data: { value: value === null || value === undefined ? "" : value } }, text);
}

function gpuTable(data) {
  const rows = data.series.map((se) => h("tr", { testid: "usage-gpu-row", data: { team: se.team } },
    h("td", { testid: "usage-gpu-team" }, se.team),
    valueCell(se.total, fmt(se.total), "usage-gpu-hours"),
    valueCell(Math.max(...se.points.map((p) => p[1])), fmt(Math.max(...se.points.map((p) => p[1]))), null)));
  return table([{ title: "team" }, { title: "GPU-hours", cls: "num" }, { title: "busiest day", cls: "num" }],
    rows, { testid: "usage-gpu-table", class: "compact" });
}

function waitTable(data) {
  const rows = data.series.map((se) => h("tr", { testid: "usage-wait-row", data: { team: se.team } },
    h("td", null, se.team),
    valueCell(se.total, seconds(se.total), "usage-wait-mean"),
    valueCell(se.max_s, seconds(se.max_s), "usage-wait-max"),
    valueCell(se.count, num(se.count), "usage-wait-count")));
  return table([{ title: "team" }, { title: "mean wait", cls: "num" }, { title: "max wait", cls: "num" },
    { title: "admissions", cls: "num" }], rows, { testid: "usage-wait-table", class: "compact" });
}

// Cost per team this month: a bar per team, with its budget as a marker when it has one.
function costBars(month, budgets, colors) {
  const byTeam = new Map((budgets || []).map((b) => [b.team, b]));
  const teams = month.groups.map((g) => g.key);
  for (const b of budgets || []) if (!teams.includes(b.team)) teams.push(b.team);
  const cost = new Map(month.groups.map((g) => [g.key, g.cost]));
  const scale = Math.max(...teams.map((t) => Math.max(cost.get(t) || 0, (byTeam.get(t) || {}).monthly_usd || 0)), 0) || 1;
  if (!teams.length) return h("p", { class: "muted" }, "No usage this month yet.");
  return h("div", { class: "hbars", testid: "usage-cost" }, teams.map((t) => {
    const spent = cost.get(t) || 0;
    const b = byTeam.get(t);
    const track = h("div", { class: "hbar-track" });
    const fillEl = h("div", { class: "hbar-fill" + (b && b.state && b.state !== "ok" ? " " + b.state : "") });
    fillEl.style.width = (100 * spent) / scale + "%";
    fillEl.style.background = b && spent > b.monthly_usd ? "var(--bad)" : colors.get(t) || PALETTE[7];
    track.appendChild(fillEl);
    if (b) {
      const mark = h("div", { class: "hbar-budget", title: `budget ${money(b.monthly_usd)}` });
      mark.style.left = (100 * b.monthly_usd) / scale + "%";
      track.appendChild(mark);
    }
    const note = b
      ? [" of ", h("span", { testid: "usage-budget", data: { value: b.monthly_usd } }, money(b.monthly_usd)),
        h("span", { class: spent > b.monthly_usd ? "bad-text" : "muted" }, ` (${Math.round(100 * spent / (b.monthly_usd || 1))}%)`)]
      : h("span", { class: "muted" }, " · no budget");
    return h("div", { class: "hbar", testid: "usage-cost-row", data: { team: t },
      title: `${t}: ${money(spent)} this month` + (b ? ` of ${money(b.monthly_usd)}` : "") },
    h("div", { class: "hbar-label", testid: "usage-cost-team" }, t), track,
    h("div", { class: "hbar-value" },
      h("span", { testid: "usage-cost-spent", data: { value: spent } }, money(spent)), note));
  }));
}

function topTable(groups, kind, testid) {
  const rows = groups.slice(0, 10).map((g, i) => h("tr", { testid: testid + "-row", data: { key: g.key } },
    h("td", { class: "num muted" }, String(i + 1)),
    h("td", { testid: testid + "-key" }, kind === "job" ? h("a", { href: route("jobs", g.key), class: "mono" }, g.key) : g.key),
    valueCell(g.gpu_hours, fmt(g.gpu_hours), testid + "-gpu-hours"),
    valueCell(g.run_seconds, duration(g.run_seconds), null),
    valueCell(g.cost, money(g.cost), testid + "-cost")));
  return table([{ title: "#", cls: "num" }, { title: kind }, { title: "GPU-hours", cls: "num" },
    { title: "run time", cls: "num" }, { title: "cost", cls: "num" }], rows, { testid, class: "compact" });
}

// Usage by service: the ledger's lines of services' replicas (job lines have no service).
function servicesPanel(services) {
  if (!services) return h("p", { class: "muted", testid: "usage-top-services-missing" }, "Usage by service is not available from this API.");
  const groups = services.groups.filter((g) => g.key !== null && g.key !== undefined && g.key !== "");
  if (!groups.length) return h("p", { class: "muted", testid: "usage-top-services-none" }, "No service used GPUs or CPUs in this period.");
  return topTable(groups, "service", "usage-top-services");
}

// A 4xx from a route another part is still adding (budgets, usage by service): null.
async function optional(promise) {
  try {
    return await promise;
  } catch (e) {
    if (e.status >= 400 && e.status < 500 && e.status !== 401) return null;
    throw e;
  }
}

function monthStart() {
  const d = new Date();
  return `${d.getUTCFullYear()}-${String(d.getUTCMonth() + 1).padStart(2, "0")}-01`;
}

export class UsageView {
  constructor(api) {
    this.api = api;
    this.period = "30d";
    this.last = 0;
  }

  mount(el) {
    this.el = el;
    fill(el, h("p", { class: "muted" }, "loading…"));
  }

  async refresh(force) {
    if (!force && Date.now() - this.last < REFRESH_MS) return;
    const since = this.period;
    const api = this.api;
    const [gpu, wait, month, jobs, services, budgets] = await Promise.all([
      api.json("/v1/usage/series", { since, step: "1d", metric: "gpu_hours" }),
      api.json("/v1/usage/series", { since, step: "1d", metric: "queue_wait_s" }),
      api.json("/v1/usage", { since: monthStart(), by: "team" }),
      api.json("/v1/usage", { since, by: "job" }),
      optional(api.json("/v1/usage", { since, by: "service" })),
      optional(api.json("/v1/budgets").then((b) => b.budgets)),
    ]);
    this.last = Date.now();
    // Redraw only what changed (the answers' `until` always does): a tooltip being read
    // or a scroll position is not reset every refresh for nothing.
    const key = since + JSON.stringify([gpu, wait, month, jobs, services, budgets],
      (k, v) => (k === "until" ? undefined : v));
    if (key === this.key) return;
    this.key = key;
    this.render(gpu, wait, month, jobs, services, budgets);
  }

  render(gpu, wait, month, jobs, services, budgets) {
    const names = [...new Set([...gpu.series, ...wait.series].map((se) => se.team)
      .concat(month.groups.map((g) => g.key), (budgets || []).map((b) => b.team)))].sort();
    const colors = new Map(names.map((t, i) => [t, PALETTE[i % PALETTE.length]]));
    const totals = new Map(gpu.series.map((se) => [se.team, se.total]));
    const means = new Map(wait.series.map((se) => [se.team, se.total]));
    const label = (PERIODS.find(([k]) => k === this.period) || [])[1] || this.period;
    const picker = h("select", { testid: "usage-period", "aria-label": "period",
      onchange: (e) => { this.period = e.target.value; this.refresh(true).catch(() => { this.last = 0; }); } },
    PERIODS.map(([k, text]) => h("option", { value: k, selected: k === this.period }, "last " + text)));
    const gpuSum = gpu.series.reduce((acc, se) => acc + se.total, 0);
    const monthCost = month.total.cost;
    const allWaits = wait.series.reduce((acc, se) => acc + se.count, 0);
    const meanWait = allWaits ? wait.series.reduce((acc, se) => acc + se.total * se.count, 0) / allWaits : null;
    fill(this.el,
      h("div", { class: "toolbar" }, h("h1", null, "Usage"), h("span", { class: "spacer" }), picker),
      h("div", { class: "stats" },
        h("div", { class: "stat run" }, h("div", { class: "stat-value", testid: "usage-stat-gpu-hours", data: { value: gpuSum } }, fmt(gpuSum)),
          h("div", { class: "stat-label" }, "GPU-hours, last " + label)),
        h("div", { class: "stat" }, h("div", { class: "stat-value", testid: "usage-stat-month-cost", data: { value: monthCost } }, money(monthCost)),
          h("div", { class: "stat-label" }, "cost this month (UTC)")),
        h("div", { class: "stat wait" }, h("div", { class: "stat-value", testid: "usage-stat-wait", data: { value: meanWait ?? "" } }, seconds(meanWait)),
          h("div", { class: "stat-label" }, "mean queue wait, last " + label))),
      section("GPU-hours per team per day",
        gpu.series.length ? [legend(names.filter((t) => totals.has(t)), colors, totals, (v) => fmt(v) + " GPU-h", "usage-gpu-legend"),
          chartBox(stackedBars(gpu, colors), "usage-gpu-chart"), gpuTable(gpu)]
          : h("p", { class: "muted" }, "No GPU time in this period.")),
      h("div", { class: "usage-grid" },
        section("Cost this month per team" + (budgets ? ", against budget" : ""),
          costBars(month, budgets, colors),
          budgets ? null : h("p", { class: "muted" }, "Budgets are not available from this API.")),
        section("Top services by cost, last " + label, servicesPanel(services))),
      section("Queue wait per team (mean per day)",
        wait.series.length ? [legend(names.filter((t) => means.has(t)), colors, means, (v) => "mean " + seconds(v), "usage-wait-legend"),
          chartBox(lines(wait, colors), "usage-wait-chart"), waitTable(wait)]
          : h("p", { class: "muted" }, "No admissions in this period.")),
      section("Top jobs by cost, last " + label, topTable(jobs.groups, "job", "usage-top-jobs")));
  }
}
