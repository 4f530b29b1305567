// Services with their replicas and load, and the events stream.

import { badge, bar, clock, extLink, fill, h, num, route, shortId, since, stat, table } from "./dom.js";

const MAX_EVENTS = 1000; // kept in the page, newest first
const MAX_EVENT_PAGES = 40; // per tick; the API returns at most 500 events a call

function replicaRow(r, nodeNames) {
  return h("tr", { testid: "replica-row", data: { replicaId: r.id, status: r.status } },
    h("td", { class: "mono" }, r.id),
    h("td", null, badge(r.status, "replica-status")),
    h("td", { testid: "replica-node" }, r.node_id ? nodeNames.get(r.node_id) || shortId(r.node_id) : "—"),
    h("td", null, extLink(r.url, { testid: "replica-url", class: "mono" })),
    h("td", { class: "num" }, r.ready_at ? since(r.ready_at) : "—"),
    h("td", { testid: "replica-engine", class: "mono" }, engineText(r.engine_metrics)),
    h("td", { class: "reason" }, [r.reason, r.message].filter(Boolean).join(": ")));
}

// The engine's own series as last scraped (vLLM): running/waiting, KV cache, prefix-cache hits.
function engineText(m) {
  if (!m || !Object.keys(m).length) return "—";
  const parts = [num(m.requests_running ?? 0) + " run / " + num(m.requests_waiting ?? 0) + " wait"];
  if (m.kv_cache_usage !== undefined) parts.push("KV " + (100 * m.kv_cache_usage).toFixed(1) + "%");
  if (m.prefix_cache_queries) {
    parts.push("prefix hits " + (100 * (m.prefix_cache_hits || 0) / m.prefix_cache_queries).toFixed(1) + "%");
  }
  return parts.join(" · ");
}

function serviceCard(s, nodeNames) {
  const replicas = s.replicas || [];
  const max = Math.max(Number(s.replicas_max || 0), replicas.length, 1);
  const wanted = s.manual_replicas ?? s.replicas_min;
  return h("section", { class: "panel", testid: "service-card", data: { service: s.name, team: s.team } },
    h("h2", null, h("span", { testid: "service-name" }, s.name),
      h("span", { class: "muted" }, "  team " + s.team + " · " + (s.engine || "?") + " · model " + (s.model || "?"))),
    h("div", { class: "stats small" },
      stat("ready replicas", num(s.ready), "service-ready", s.ready ? "ok" : "wait"),
      stat("replicas (live)", num(replicas.length), "service-replicas"),
      stat("min / max", num(s.replicas_min) + " / " + num(s.replicas_max), "service-bounds"),
      stat("target", wanted === null || wanted === undefined ? "auto" : num(wanted), "service-target"),
      stat("ongoing requests", num(s.ongoing_requests), "service-ongoing", s.ongoing_requests ? "run" : "")),
    bar([{ value: s.ready, tone: "ok", label: "ready" },
      { value: replicas.length - s.ready, tone: "wait", label: "starting" }], max),
    table([{ title: "replica" }, { title: "status" }, { title: "node" }, { title: "URL" },
      { title: "ready for", cls: "num" }, { title: "engine" }, { title: "reason" }],
    replicas.map((r) => replicaRow(r, nodeNames)), { testid: "replicas-table" }));
}

export class ServicesView {
  constructor(api) {
    this.api = api;
    this.nodeNames = new Map();
  }

  mount(el) { this.el = el; fill(el, h("p", { class: "muted" }, "loading…")); }

  async refresh() {
    const services = await this.api.services();
    const needed = services.flatMap((s) => (s.replicas || []).map((r) => r.node_id)).filter(Boolean);
    if (needed.some((id) => !this.nodeNames.has(id))) {
      for (const n of await this.api.nodes()) this.nodeNames.set(n.node_id, n.name);
    }
    services.sort((a, b) => (a.team + a.name).localeCompare(b.team + b.name));
    fill(this.el,
      h("p", { class: "muted", testid: "services-count" }, services.length + (services.length === 1 ? " service" : " services")),
      services.map((s) => serviceCard(s, this.nodeNames)));
  }
}

function objectCell(e) {
  if (e.kind === "job") return h("a", { href: route("jobs", e.object_id), class: "mono" }, e.object_id);
  // node ids are long hex strings; other objects are named
  const id = String(e.object_id || "");
  return h("span", { class: "mono", title: id }, /^[0-9a-f]{32,}$/.test(id) ? shortId(id) : id);
}

function eventRow(e) {
  return h("tr", { testid: "event-row", data: { eventId: e.id, objectId: e.object_id, kind: e.kind } },
    h("td", { class: "num" }, String(e.id)),
    h("td", { class: "num" }, clock(e.ts)),
    h("td", { testid: "event-kind" }, e.kind),
    h("td", null, objectCell(e)),
    h("td", null, e.team || "—"),
    h("td", { testid: "event-type" }, e.type),
    h("td", { testid: "event-transition" },
      e.from_status || e.to_status ? (e.from_status || "·") + " → " + (e.to_status || "·") : ""),
    h("td", { testid: "event-reason" }, e.reason || ""),
    h("td", { class: "reason" }, e.message || ""),
    h("td", null, e.actor || ""));
}

export class EventsView {
  constructor(api) {
    this.api = api;
    this.after = 0;
    this.events = [];
    this.kind = "";
    this.text = "";
  }

  mount(el) {
    this.kindSelect = h("select", { testid: "events-kind-filter", onchange: (e) => { this.kind = e.target.value; this.render(); } },
      h("option", { value: "" }, "all kinds"));
    const search = h("input", { type: "search", placeholder: "filter by object id, team, type, reason", testid: "events-search",
      oninput: (e) => { this.text = e.target.value.trim().toLowerCase(); this.render(); } });
    this.body = h("div", null, h("p", { class: "muted" }, "loading…"));
    fill(el, h("div", { class: "toolbar" }, this.kindSelect, search), this.body);
  }

  async refresh() {
    let got = 0;
    for (let page = 0; page < MAX_EVENT_PAGES; page += 1) {
      const batch = await this.api.events(this.after);
      if (!batch.length) break;
      this.after = batch[batch.length - 1].id;
      this.events.push(...batch);
      got += batch.length;
      if (this.events.length > MAX_EVENTS) this.events.splice(0, this.events.length - MAX_EVENTS);
      if (batch.length < 500) break;
    }
    if (got || !this.rendered) this.render();
  }

  render() {
    this.rendered = true;
    const kinds = [...new Set(this.events.map((e) => e.kind))].sort();
    if (this.kindSelect.options.length !== kinds.length + 1) {
      fill(this.kindSelect, h("option", { value: "" }, "all kinds"), kinds.map((k) => h("option", { value: k }, k)));
      this.kindSelect.value = this.kind;
    }
    const t = this.text;
    const match = (e) => (!this.kind || e.kind === this.kind) && (!t ||
      [e.object_id, e.team, e.type, e.reason, e.to_status, e.message].some((s) => s && String(s).toLowerCase().includes(t)));
    const shown = this.events.filter(match).reverse();
    fill(this.body,
      h("p", { class: "muted", testid: "events-count" }, `${shown.length} events (newest first, last ${MAX_EVENTS} kept)`),
      table([{ title: "#", cls: "num" }, { title: "time", cls: "num" }, { title: "kind" }, { title: "object" },
        { title: "team" }, { title: "type" }, { title: "transition" }, { title: "reason" }, { title: "message" },
        { title: "actor" }], shown.map(eventRow), { testid: "events-table" }));
  }
}
