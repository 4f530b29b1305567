// Cluster overview (nodes, GPUs by state, pools) and the queue per team.
// GPU states: a node that is not alive (or in state Down) has all its GPUs "down";
// on the other nodes a GPU is "allocated" when a job or replica holds it, else "free".

import { badge, bar, bytes, fill, h, num, route, section, shortId, since, stat, table } from "./dom.js";

export function nodeState(n) {
  return n.state || (n.alive ? "Ready" : "Down");
}

function isDown(n) {
  return !n.alive || nodeState(n) === "Down";
}

export function gpuCounts(nodes) {
  const c = { total: 0, allocated: 0, free: 0, down: 0 };
  for (const n of nodes) {
    const gpus = Number(n.gpus || 0);
    const used = Math.min(gpus, Number((n.allocated && n.allocated.gpus) || 0));
    c.total += gpus;
    if (isDown(n)) c.down += gpus;
    else { c.allocated += used; c.free += gpus - used; }
  }
  return c;
}

function cpuCounts(nodes) {
  const live = nodes.filter((n) => !isDown(n));
  return {
    total: live.reduce((s, n) => s + Number(n.cpus || 0), 0),
    allocated: live.reduce((s, n) => s + Number((n.allocated && n.allocated.cpus) || 0), 0),
  };
}

function gpuBar(c) {
  return bar([
    { value: c.allocated, tone: "run", label: "allocated" },
    { value: c.free, tone: "ok", label: "free" },
    { value: c.down, tone: "bad", label: "down" },
  ], c.total);
}

function poolRows(nodes) {
  const pools = new Map();
  for (const n of nodes) {
    if (!pools.has(n.pool)) pools.set(n.pool, []);
    pools.get(n.pool).push(n);
  }
  return [...pools.keys()].sort().map((pool) => {
    const members = pools.get(pool);
    const g = gpuCounts(members);
    const cpu = cpuCounts(members);
    const models = [...new Set(members.map((n) => n.gpu_model).filter(Boolean))].sort();
    return h("tr", { testid: "pool-row", data: { pool } },
      h("td", { testid: "pool-name" }, pool),
      h("td", { class: "num", testid: "pool-nodes" }, members.filter((n) => !isDown(n)).length + " / " + members.length),
      h("td", { class: "num", testid: "pool-gpus-total" }, num(g.total)),
      h("td", { class: "num", testid: "pool-gpus-allocated" }, num(g.allocated)),
      h("td", { class: "num", testid: "pool-gpus-free" }, num(g.free)),
      h("td", { class: "num", testid: "pool-gpus-down" }, num(g.down)),
      h("td", null, gpuBar(g)),
      h("td", { class: "num" }, num(cpu.allocated) + " / " + num(cpu.total)),
      h("td", null, models.join(", ") || "—"));
  });
}

function labelChips(labels) {
  return Object.entries(labels || {}).sort().map(([k, v]) => h("span", { class: "chip" }, k + "=" + v));
}

// Health checks: a count per outcome; failing checks are listed with their message.
function healthCell(checks) {
  if (!checks || !checks.length) return h("span", { class: "muted" }, "—");
  const count = (st) => checks.filter((c) => c.status === st).length;
  const failing = checks.filter((c) => c.status === "fail");
  return [
    h("span", { testid: "node-checks", class: failing.length ? "bad-text" : "muted" },
      `${count("ok")} ok · ${failing.length} failing · ${count("not_applicable")} n/a`),
    failing.map((c) => h("div", { class: "reason", testid: "node-check-failing" }, c.name + ": " + (c.message || "failed"))),
  ];
}

// Each node's newest `aicluster doctor` verdict (reports come newest first): fail when the
// report failed the node, else the worst verdict of its own checks (core.doctor).
const DOCTOR_ORDER = ["not_applicable", "unjudged", "ok", "warn", "fail"];

export function doctorByNode(reports) {
  const out = new Map();
  for (const r of reports) {
    for (const id of r.nodes || []) {
      if (out.has(id)) continue;
      const own = ((r.report && r.report.checks) || []).filter((c) => c.node === id && !c.peer);
      let verdict = (r.failing_nodes || []).includes(id) ? "fail" : "unjudged";
      for (const c of own) {
        if (DOCTOR_ORDER.indexOf(c.verdict) > DOCTOR_ORDER.indexOf(verdict)) verdict = c.verdict;
      }
      const failing = own.filter((c) => c.verdict === "fail").map((c) => c.check);
      out.set(id, { verdict, at: r.created_at, failing });
    }
  }
  return out;
}

function doctorCell(d) {
  if (!d) return h("span", { class: "muted" }, "—");
  const tone = d.verdict === "fail" ? "bad-text" : d.verdict === "ok" ? null : "muted";
  return [
    h("span", { testid: "node-doctor", class: tone }, d.verdict),
    h("span", { class: "muted" }, " · " + since(d.at) + " ago"),
    d.failing.length ? h("div", { class: "reason", testid: "node-doctor-failing" }, d.failing.join(", ")) : null,
  ];
}

function nodeRow(n, doctor) {
  const state = nodeState(n);
  const alloc = n.allocated || {};
  return h("tr", { testid: "node-row", data: { nodeId: n.node_id }, class: isDown(n) ? "down" : null },
    h("td", null,
      h("div", { testid: "node-name" }, n.name || shortId(n.node_id), n.is_head ? h("span", { class: "chip head" }, "head") : null),
      h("div", { class: "muted mono" }, shortId(n.node_id) + " · " + (n.address || ""))),
    h("td", { testid: "node-pool" }, n.pool),
    h("td", null, badge(state, "node-state"), n.reason ? h("div", { class: "muted" }, n.reason) : null),
    h("td", { class: "num" },
      h("span", { testid: "node-cpus-allocated" }, num(alloc.cpus || 0)), " / ",
      h("span", { testid: "node-cpus-total" }, num(n.cpus))),
    h("td", { class: "num" }, bytes(alloc.memory || 0) + " / " + bytes(n.memory)),
    h("td", { class: "num" },
      h("span", { testid: "node-gpus-allocated" }, num(alloc.gpus || 0)), " / ",
      h("span", { testid: "node-gpus-total" }, num(n.gpus))),
    h("td", { testid: "node-gpu-model" }, n.gpu_model || "—"),
    h("td", null, healthCell(n.checks)),
    h("td", null, doctorCell(doctor)),
    h("td", { class: "labels" }, labelChips(n.labels)));
}

function stateCounts(nodes) {
  const counts = new Map();
  for (const n of nodes) counts.set(nodeState(n), (counts.get(nodeState(n)) || 0) + 1);
  return [...counts.keys()].sort().map((st) => h("span", { class: "state-count" }, badge(st),
    " ", h("span", { testid: "stat-nodes-" + st.toLowerCase() }, String(counts.get(st)))));
}

export class OverviewView {
  constructor(api) { this.api = api; }

  mount(el) { this.el = el; fill(el, h("p", { class: "muted" }, "loading…")); }

  async refresh() {
    const [nodes, reports] = await Promise.all([this.api.nodes(), this.api.doctorReports()]);
    const doctor = doctorByNode(reports);
    nodes.sort((a, b) => (a.pool + a.name).localeCompare(b.pool + b.name));
    const g = gpuCounts(nodes);
    const cpu = cpuCounts(nodes);
    const pools = new Set(nodes.map((n) => n.pool));
    const up = nodes.filter((n) => !isDown(n)).length;
    fill(this.el,
      h("div", { class: "stats", testid: "overview-stats" },
        stat("nodes up / total", h("span", null,
          h("span", { testid: "stat-nodes-up" }, num(up)), " / ",
          h("span", { testid: "stat-nodes-total" }, num(nodes.length))), null),
        stat("GPUs", num(g.total), "stat-gpus-total"),
        stat("GPUs allocated", num(g.allocated), "stat-gpus-allocated", "run"),
        stat("GPUs free", num(g.free), "stat-gpus-free", "ok"),
        stat("GPUs down", num(g.down), "stat-gpus-down", g.down ? "bad" : ""),
        stat("CPUs allocated / up", h("span", null,
          h("span", { testid: "stat-cpus-allocated" }, num(cpu.allocated)), " / ",
          h("span", { testid: "stat-cpus-total" }, num(cpu.total))), null),
        stat("pools", num(pools.size), "stat-pools")),
      h("div", { class: "states muted", testid: "node-states" }, "node states: ", stateCounts(nodes)),
      h("div", { class: "wide-bar" }, gpuBar(g),
        h("div", { class: "legend muted" },
          h("span", { class: "dot run" }), "allocated ", h("span", { class: "dot ok" }), "free ",
          h("span", { class: "dot bad" }), "down")),
      section("Pools", table(
        [{ title: "pool" }, { title: "nodes up", cls: "num" }, { title: "GPUs", cls: "num" },
          { title: "allocated", cls: "num" }, { title: "free", cls: "num" }, { title: "down", cls: "num" },
          { title: "" }, { title: "CPUs alloc / up", cls: "num" }, { title: "GPU models" }],
        poolRows(nodes), { testid: "pools-table" })),
      section("Nodes", table(
        [{ title: "node" }, { title: "pool" }, { title: "state" }, { title: "CPUs", cls: "num" },
          { title: "memory", cls: "num" }, { title: "GPUs", cls: "num" }, { title: "GPU model" },
          { title: "health checks" }, { title: "doctor" }, { title: "labels" }],
        nodes.map((n) => nodeRow(n, doctor.get(n.node_id))), { testid: "nodes-table" })));
  }
}

function gangText(job) {
  const r = (job.spec && job.spec.resources) || {};
  const parts = [num(r.cpus ?? 1) + " CPU"];
  if (r.gpus) parts.push(num(r.gpus) + " GPU" + (r.gpu_model ? " " + r.gpu_model : ""));
  return num(job.workers) + " × (" + parts.join(", ") + ")";
}

function gpusOf(job) {
  const r = (job.spec && job.spec.resources) || {};
  return Number(r.gpus || 0) * Number(job.workers || 1);
}

// Queue order shown: higher priority first, then earlier submission.
function queueOrder(a, b) {
  return (b.priority || 0) - (a.priority || 0) || a.created_at - b.created_at;
}

function teamCard(team, jobs) {
  const pending = jobs.filter((j) => j.status === "PENDING").sort(queueOrder);
  const active = jobs.filter((j) => j.status === "ADMITTED" || j.status === "RUNNING");
  const rows = pending.map((j, i) => h("tr", { testid: "queue-job", data: { jobId: j.id } },
    h("td", { class: "num" }, String(i + 1)),
    h("td", null, h("a", { href: route("jobs", j.id), class: "mono" }, j.id)),
    h("td", { class: "num" }, num(j.priority)),
    h("td", null, gangText(j)),
    h("td", { class: "num" }, since(j.created_at)),
    h("td", { testid: "queue-job-message", class: "reason" }, j.message || "—")));
  return h("section", { class: "panel", testid: "queue-team", data: { team } },
    h("h2", null, "team ", h("span", { testid: "queue-team-name" }, team)),
    h("div", { class: "stats small" },
      stat("pending", num(pending.length), "queue-pending-count", pending.length ? "wait" : ""),
      stat("admitted / running", num(active.length), "queue-running-count", "run"),
      stat("GPUs held", num(active.reduce((s, j) => s + gpusOf(j), 0)), "queue-gpus-held"),
      stat("GPUs wanted", num(pending.reduce((s, j) => s + gpusOf(j), 0)), "queue-gpus-wanted")),
    table([{ title: "#", cls: "num" }, { title: "job" }, { title: "priority", cls: "num" },
      { title: "gang" }, { title: "waiting", cls: "num" }, { title: "why it waits" }], rows));
}

export class QueueView {
  constructor(api) { this.api = api; }

  mount(el) { this.el = el; fill(el, h("p", { class: "muted" }, "loading…")); }

  async refresh() {
    const [jobs, teams] = await Promise.all([
      this.api.jobs(["PENDING", "ADMITTED", "RUNNING"]), this.api.teams()]);
    const byTeam = new Map(teams.map((t) => [t, []]));
    for (const j of jobs) {
      if (!byTeam.has(j.team)) byTeam.set(j.team, []);
      byTeam.get(j.team).push(j);
    }
    const names = [...byTeam.keys()].sort();
    fill(this.el,
      h("p", { class: "muted" }, "Pending jobs per team, in order of priority then submission time, with the reason each one waits."),
      names.map((t) => teamCard(t, byTeam.get(t))));
  }
}
