// The jobs table and one job's page: summary, placement, events and live logs per rank.

import { TERMINAL } from "./api.js";
import { badge, clock, duration, fill, h, num, route, section, shortId, since, stamp, table } from "./dom.js";

const STATUSES = ["PENDING", "ADMITTED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"];
const PAGE_ROWS = 100; // jobs per page: the API's keyset pages (api.paging)
const MAX_LOG_CHARS = 400000; // per rank kept in the page; older output is trimmed
const MAX_READS_PER_TICK = 8; // each read returns at most 1 MiB

function plural(n, word) {
  return n + " " + word + (n === 1 ? "" : "s");
}

function runtime(j) {
  if (!j.started_at) return "—";
  return duration((j.finished_at || Date.now() / 1000) - j.started_at);
}

function jobRow(j) {
  const r = (j.spec && j.spec.resources) || {};
  return h("tr", { testid: "job-row", data: { jobId: j.id, status: j.status } },
    h("td", null, h("a", { href: route("jobs", j.id), class: "mono", testid: "job-link" }, j.id)),
    h("td", { testid: "job-name" }, j.name),
    h("td", null, j.team),
    h("td", null, j.owner),
    h("td", null, badge(j.status, "job-status")),
    h("td", { testid: "job-reason" }, j.reason || "—"),
    h("td", { class: "reason" }, j.message || ""),
    h("td", { class: "num" }, num(j.workers) + (r.gpus ? " × " + num(r.gpus) + " GPU" : "")),
    h("td", { class: "num" }, since(j.created_at)),
    h("td", { class: "num" }, runtime(j)));
}

export class JobsView {
  constructor(api) {
    this.api = api;
    this.status = "";
    this.text = "";
    this.cursor = null; // the page shown: null for the newest
    this.back = []; // the cursors of the pages before it, to go back to
  }

  goTo(cursor, back) {
    this.cursor = cursor;
    this.back = back;
    this.refresh();
  }

  mount(el) {
    const select = h("select", { testid: "jobs-status-filter", onchange: (e) => { this.status = e.target.value; this.goTo(null, []); } },
      h("option", { value: "" }, "all statuses"), STATUSES.map((s) => h("option", { value: s }, s)));
    const search = h("input", { type: "search", placeholder: "filter by name, id, team", testid: "jobs-search",
      oninput: (e) => { this.text = e.target.value.trim().toLowerCase(); this.render(); } });
    this.body = h("div", null, h("p", { class: "muted" }, "loading…"));
    fill(el, h("div", { class: "toolbar" }, select, search), this.body);
  }

  async refresh() {
    const status = this.status;
    const cursor = this.cursor;
    const page = await this.api.jobsPage(status ? [status] : [], PAGE_ROWS, cursor);
    if (status !== this.status || cursor !== this.cursor) return; // changed while in flight
    this.jobs = page.items;
    this.next = page.next;
    this.render();
  }

  render() {
    if (!this.jobs) return;
    const t = this.text;
    const match = (j) => !t || [j.id, j.name, j.team, j.owner].some((s) => String(s).toLowerCase().includes(t));
    const shown = this.jobs.filter(match).sort((a, b) => b.created_at - a.created_at);
    const rows = shown.map(jobRow);
    const first = this.back.length * PAGE_ROWS;
    const where = this.back.length || this.next
      ? ` (page ${this.back.length + 1}: jobs ${first + 1}–${first + this.jobs.length}, newest first)` : "";
    const pager = (this.back.length || this.next) && h("div", { class: "toolbar", testid: "jobs-pager" },
      h("button", { testid: "jobs-newer", disabled: !this.back.length,
        onclick: () => this.goTo(this.back[this.back.length - 1], this.back.slice(0, -1)) }, "← newer"),
      h("button", { testid: "jobs-older", disabled: !this.next,
        onclick: () => this.goTo(this.next, [...this.back, this.cursor]) }, "older →"));
    fill(this.body,
      h("p", { class: "muted", testid: "jobs-count" }, plural(shown.length, "job") + where),
      table([{ title: "id" }, { title: "name" }, { title: "team" }, { title: "owner" }, { title: "status" },
        { title: "reason" }, { title: "message" }, { title: "workers", cls: "num" },
        { title: "age", cls: "num" }, { title: "runtime", cls: "num" }], rows, { testid: "jobs-table" }),
      pager);
  }
}

// Follows one rank's log by byte offset, attempt by attempt (drains an attempt before
// showing the next), until the job is terminal and nothing is left to read.
class LogFollower {
  constructor(api, jobId, rank) {
    Object.assign(this, { api, jobId, rank });
    this.offset = 0;
    this.attempt = null;
    this.decoder = new TextDecoder("utf-8");
    this.text = "";
    this.trimmed = false;
    this.done = false;
  }

  add(s) {
    this.text += s;
    if (this.text.length > MAX_LOG_CHARS) {
      this.text = this.text.slice(this.text.length - MAX_LOG_CHARS);
      this.trimmed = true;
    }
  }

  // Reads what is new; returns true when text was added. One read at a time: a call
  // made while another is in flight (a rank switch during a poll) does nothing.
  async poll(jobAttempt) {
    if (this.done || this.busy) return false;
    this.busy = true;
    try {
      return await this.read(jobAttempt);
    } finally {
      this.busy = false;
    }
  }

  async read(jobAttempt) {
    const before = this.text.length + (this.trimmed ? 1 : 0);
    for (let i = 0; i < MAX_READS_PER_TICK; i += 1) {
      const r = await this.api.logs(this.jobId, this.rank, this.offset); // the latest attempt
      if (this.attempt === null) this.attempt = r.attempt;
      if (r.attempt !== this.attempt) {
        // Attempt 0: the job had not been admitted when the view opened; its first
        // attempt's log is the log, with no header.
        const started = this.attempt !== 0;
        if (started) await this.drain(this.attempt);
        this.attempt = r.attempt;
        this.offset = 0;
        this.decoder = new TextDecoder("utf-8");
        if (started) this.add(`\n──── attempt ${r.attempt} ────\n`);
        continue;
      }
      if (r.data.length) {
        this.offset = r.next;
        this.add(this.decoder.decode(r.data, { stream: true }));
        continue;
      }
      if (TERMINAL.has(r.status) && r.attempt === jobAttempt) {
        this.add(this.decoder.decode());
        this.done = true;
      }
      break;
    }
    return this.text.length + (this.trimmed ? 1 : 0) !== before || this.done;
  }

  async drain(attempt) {
    for (let i = 0; i < MAX_READS_PER_TICK; i += 1) {
      const r = await this.api.logs(this.jobId, this.rank, this.offset, attempt);
      if (!r.data.length) break;
      this.offset = r.next;
      this.add(this.decoder.decode(r.data, { stream: true }));
    }
    this.add(this.decoder.decode());
  }
}

function field(label, value, testid) {
  return [h("dt", null, label), h("dd", { testid }, value)];
}

// One attempt of the job: where it ran, when, why it ended, and how long it took to run
// again after the previous one was interrupted (detection + queue + launch).
function attemptRow(a, names) {
  const r = a.recovery;
  return h("tr", { testid: "job-attempt", data: { attempt: a.attempt } },
    h("td", { class: "num" }, String(a.attempt)),
    h("td", null, (a.placement || []).map((id) => names.get(id) || shortId(id)).join(", ") || "—"),
    h("td", { class: "num" }, stamp(a.started_at)),
    h("td", { class: "num" }, stamp(a.ended_at)),
    h("td", { class: "num" }, a.runtime_s == null ? "—" : duration(a.runtime_s)),
    h("td", { testid: "job-attempt-end" }, a.end_reason || (a.ended_at ? "—" : "running")),
    h("td", { testid: "job-attempt-recovery" }, r ? r.total_s.toFixed(1) + " s (detect " +
      r.detection_s.toFixed(1) + " s, queue " + r.queue_s.toFixed(1) + " s, launch " +
      r.launch_s.toFixed(1) + " s)" : "—"));
}

function eventRow(e) {
  return h("tr", { testid: "job-event", data: { eventId: e.id, to: e.to_status || "" } },
    h("td", { class: "num" }, clock(e.ts)),
    h("td", null, e.type),
    h("td", { testid: "job-event-transition" }, (e.from_status || "·") + " → " + (e.to_status || "·")),
    h("td", null, e.reason || ""),
    h("td", { class: "reason" }, e.message || ""),
    h("td", null, e.actor || ""));
}

export class JobView {
  constructor(api, jobId) {
    this.api = api;
    this.jobId = jobId;
    this.rank = 0;
    this.followers = new Map();
    this.nodeNames = new Map();
  }

  mount(el) {
    this.summary = h("div", null, h("p", { class: "muted" }, "loading…"));
    this.tabs = h("div", { class: "tabs", testid: "log-ranks" });
    this.logState = h("span", { class: "muted", testid: "log-status" });
    this.pre = h("pre", { class: "logs", testid: "job-logs" });
    fill(el,
      h("p", null, h("a", { href: "#/jobs" }, "← all jobs")),
      this.summary,
      section("Logs", h("div", { class: "toolbar" }, this.tabs, this.logState), this.pre));
  }

  follower(rank) {
    if (!this.followers.has(rank)) this.followers.set(rank, new LogFollower(this.api, this.jobId, rank));
    return this.followers.get(rank);
  }

  async refresh() {
    const job = await this.api.job(this.jobId);
    const placed = job.placement || [];
    if (placed.some((id) => !this.nodeNames.has(id))) {
      for (const n of await this.api.nodes()) this.nodeNames.set(n.node_id, n.name);
    }
    this.renderSummary(job);
    this.renderTabs(job);
    const f = this.follower(this.rank);
    const atBottom = this.pre.scrollTop + this.pre.clientHeight >= this.pre.scrollHeight - 4;
    if (await f.poll(job.attempt)) {
      this.pre.textContent = (f.trimmed ? "[earlier output trimmed]\n" : "") + f.text;
      if (atBottom) this.pre.scrollTop = this.pre.scrollHeight;
    }
    this.logState.textContent = `rank ${this.rank} · attempt ${f.attempt ?? "—"} · ` +
      (f.done ? "complete" : "following");
  }

  showRank(rank) {
    this.rank = rank;
    const f = this.follower(rank);
    this.pre.textContent = (f.trimmed ? "[earlier output trimmed]\n" : "") + f.text;
    this.pre.scrollTop = this.pre.scrollHeight;
    this.refresh().catch(() => {});
  }

  renderTabs(job) {
    const n = Math.max(1, Number(job.workers || 1));
    if (this.tabs.childElementCount === n) {
      for (const b of this.tabs.children) b.classList.toggle("active", Number(b.dataset.rank) === this.rank);
      return;
    }
    fill(this.tabs, Array.from({ length: n }, (_, r) => h("button", {
      type: "button", class: r === this.rank ? "tab active" : "tab", testid: "log-rank-tab",
      data: { rank: r }, onclick: () => this.showRank(r),
    }, "rank " + r)));
  }

  renderSummary(job) {
    const spec = job.spec || {};
    const r = spec.resources || {};
    const cmd = Array.isArray(spec.command) ? spec.command.join(" ") : String(spec.command || "");
    const placement = (job.placement || []).map((id, rank) => h("tr", { testid: "placement-row", data: { rank } },
      h("td", { class: "num" }, String(rank)),
      h("td", { testid: "placement-node" }, this.nodeNames.get(id) || shortId(id)),
      h("td", { class: "mono muted" }, id)));
    fill(this.summary,
      h("h1", null, h("span", { testid: "job-detail-name" }, job.name), " ",
        badge(job.status, "job-detail-status"), h("span", { class: "mono muted id" }, job.id)),
      h("dl", { class: "facts" },
        field("reason", job.reason || "—", "job-detail-reason"),
        field("message", job.message || "—", "job-detail-message"),
        field("exit code", job.exit_code ?? "—", "job-detail-exit-code"),
        field("team / owner", job.team + " / " + job.owner),
        field("priority", num(job.priority)),
        field("attempt / restarts", num(job.attempt) + " / " + num(job.restarts), "job-detail-attempt"),
        field("gang", num(job.workers) + " × (" + num(r.cpus ?? 1) + " CPU, " + num(r.gpus || 0) + " GPU" +
          (r.gpu_model ? " " + r.gpu_model : "") + ")"),
        field("command", h("code", null, cmd)),
        field("submitted", stamp(job.created_at)),
        field("started / finished", stamp(job.started_at) + " / " + stamp(job.finished_at)),
        field("runtime", runtime(job))),
      section("Placement", table([{ title: "rank", cls: "num" }, { title: "node" }, { title: "node id" }],
        placement, { testid: "placement-table" })),
      section("Attempts", table([{ title: "attempt", cls: "num" }, { title: "nodes" },
        { title: "started", cls: "num" }, { title: "ended", cls: "num" }, { title: "runtime", cls: "num" },
        { title: "end" }, { title: "recovered in" }],
      (job.attempts || []).map((a) => attemptRow(a, this.nodeNames)), { testid: "job-attempts" })),
      section("Events", table([{ title: "time", cls: "num" }, { title: "type" }, { title: "transition" },
        { title: "reason" }, { title: "message" }, { title: "actor" }],
      (job.events || []).slice(-200).map(eventRow), { testid: "job-events" })));
  }
}
