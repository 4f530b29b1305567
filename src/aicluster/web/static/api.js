// The JSON API as the dashboard uses it, and the poller that drives live updates.
// The token lives only in sessionStorage (this tab) and in the Authorization header.

const TOKEN_KEY = "aicluster.token";
const REQUEST_TIMEOUT_MS = 10000;
export const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);

export function savedToken() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function saveToken(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
}

export function forgetToken() {
  sessionStorage.removeItem(TOKEN_KEY);
}

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status; // 0: the API could not be reached
  }
}

async function errorFrom(resp) {
  let message = "";
  try {
    const body = await resp.json();
    const detail = body && body.detail;
    if (detail && typeof detail === "object" && !Array.isArray(detail)) message = String(detail.message || "");
    else if (typeof detail === "string") message = detail;
    else if (Array.isArray(detail)) message = detail.map((d) => (d && d.msg) || String(d)).join("; ");
  } catch (_e) {
    // not JSON: fall back to the status line
  }
  return new ApiError(resp.status, message || resp.status + " " + resp.statusText);
}

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Array.isArray(params) ? params : Object.entries(params || {})) {
    if (v !== null && v !== undefined && v !== "") q.append(k, String(v));
  }
  const s = q.toString();
  return s ? "?" + s : "";
}

export class Api {
  // onUnauthorized(): called once a request is refused with 401 (token revoked or wrong).
  constructor(token, onUnauthorized) {
    this.token = token;
    this.onUnauthorized = onUnauthorized || (() => {});
  }

  async fetch(path, params) {
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(), REQUEST_TIMEOUT_MS);
    let resp;
    try {
      resp = await fetch(path + query(params), {
        headers: { Authorization: "Bearer " + this.token, Accept: "application/json" },
        signal: ctl.signal,
        cache: "no-store",
      });
    } catch (e) {
      const why = e && e.name === "AbortError" ? "did not answer in time" : "cannot be reached";
      throw new ApiError(0, "the aicluster API " + why);
    } finally {
      clearTimeout(timer);
    }
    if (!resp.ok) {
      const err = await errorFrom(resp);
      if (resp.status === 401) this.onUnauthorized(err);
      throw err;
    }
    return resp;
  }

  async json(path, params) {
    const resp = await this.fetch(path, params);
    return resp.json();
  }

  // One page of a list route: { items, next } (next: the cursor of the following page,
  // null at the end). `params`: [key, value] pairs.
  async page(path, key, params, limit, cursor) {
    const b = await this.json(path, [...(params || []), ["limit", limit], ["cursor", cursor]]);
    return { items: b[key], next: b.next_cursor || null };
  }

  // Every page of a list route, at most `maxPages` of `limit` rows (a safety cap).
  async all(path, key, params, limit = 1000, maxPages = 20) {
    const out = [];
    let cursor = null;
    for (let i = 0; i < maxPages; i += 1) {
      const p = await this.page(path, key, params, limit, cursor);
      out.push(...p.items);
      if (!p.next) break;
      cursor = p.next;
    }
    return out;
  }

  whoami() { return this.json("/v1/whoami"); }
  nodes() { return this.all("/v1/nodes", "nodes"); }
  // The newest page of `aicluster doctor` reports, newest first (control.doctor).
  doctorReports(limit = 50) {
    return this.page("/v1/doctor/reports", "reports", [], limit, null).then((p) => p.items);
  }
  teams() { return this.json("/v1/teams").then((b) => b.teams); }
  services() { return this.all("/v1/services", "services"); }
  job(id) { return this.json("/v1/jobs/" + encodeURIComponent(id)); }

  // Jobs newest first: every page (up to the cap of `all`).
  jobs(statuses) {
    return this.all("/v1/jobs", "jobs", (statuses || []).map((s) => ["status", s]));
  }

  // One page of jobs newest first: { items, next }.
  jobsPage(statuses, limit, cursor) {
    return this.page("/v1/jobs", "jobs", (statuses || []).map((s) => ["status", s]), limit, cursor);
  }

  events(after, objectId, limit = 500) {
    return this.json("/v1/events", { after, object_id: objectId, limit }).then((b) => b.events);
  }

  // One read of a worker's log: raw bytes, the offset to read from next, the job's
  // status and the attempt the bytes belong to.
  async logs(jobId, rank, offset, attempt) {
    const resp = await this.fetch("/v1/jobs/" + encodeURIComponent(jobId) + "/logs",
      { rank, offset, attempt });
    const data = new Uint8Array(await resp.arrayBuffer());
    const next = Number(resp.headers.get("X-Next-Offset"));
    return {
      data,
      next: Number.isFinite(next) ? next : offset + data.length,
      status: resp.headers.get("X-Job-Status") || "",
      attempt: Number(resp.headers.get("X-Attempt") || 0),
    };
  }
}

// Calls `tick()` every `intervalMs`, one call at a time (the next is scheduled when the
// previous one settles), and not at all while the tab is hidden. `kick()` runs one now.
export class Poller {
  constructor(tick, intervalMs, onState) {
    this.tick = tick;
    this.intervalMs = intervalMs;
    this.onState = onState || (() => {});
    this.timer = null;
    this.running = false;
    this.again = false;
    this.stopped = true;
    this.onVisibility = () => (document.hidden ? this.pause() : this.kick());
  }

  start() {
    this.stopped = false;
    document.addEventListener("visibilitychange", this.onVisibility);
    this.kick();
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    document.removeEventListener("visibilitychange", this.onVisibility);
  }

  pause() {
    clearTimeout(this.timer);
    this.onState("paused");
  }

  async kick() {
    if (this.stopped) return;
    clearTimeout(this.timer);
    if (document.hidden) { this.pause(); return; }
    if (this.running) { this.again = true; return; }
    this.running = true;
    try {
      await this.tick();
      this.onState("live");
    } catch (e) {
      this.onState("error", e);
    } finally {
      this.running = false;
    }
    if (this.again) { this.again = false; this.kick(); return; }
    if (!this.stopped && !document.hidden) this.timer = setTimeout(() => this.kick(), this.intervalMs);
  }
}
