// The dashboard: a login screen, then one view at a time chosen by the URL hash,
// refreshed by a single poller (every 1.5 s, never overlapping, paused while hidden).

import { Api, Poller, forgetToken, saveToken, savedToken } from "./api.js";
import { OverviewView, QueueView } from "./cluster.js";
import { clock } from "./dom.js";
import { JobView, JobsView } from "./jobs.js";
import { EventsView, ServicesView } from "./services.js";
import { UsageView } from "./usage.js";

const POLL_MS = 1500;
const $ = (id) => document.getElementById(id);

const VIEWS = {
  overview: (api) => new OverviewView(api),
  queue: (api) => new QueueView(api),
  jobs: (api, arg) => (arg ? new JobView(api, arg) : new JobsView(api)),
  services: (api) => new ServicesView(api),
  usage: (api) => new UsageView(api),
  events: (api) => new EventsView(api),
};

class Dashboard {
  constructor() {
    this.api = null;
    this.view = null;
    this.poller = null;
  }

  init() {
    $("login-form").addEventListener("submit", (e) => { e.preventDefault(); this.login($("login-token").value.trim()); });
    $("logout").addEventListener("click", () => this.logout());
    window.addEventListener("hashchange", () => this.route());
    const token = savedToken();
    if (token) this.login(token, true);
    else this.showLogin("");
  }

  showLogin(message) {
    if (this.poller) this.poller.stop();
    this.poller = null;
    this.api = null;
    this.view = null;
    $("shell").hidden = true;
    $("login").hidden = false;
    const err = $("login-error");
    err.textContent = message;
    err.hidden = !message;
    $("login-token").value = "";
    $("login-token").focus();
  }

  async login(token, remembered) {
    if (!token) return this.showLogin("Paste an API token first.");
    const api = new Api(token);
    let who;
    try {
      who = await api.whoami();
    } catch (e) {
      if (e.status === 401) forgetToken();
      const msg = e.status === 401
        ? "That token was rejected (" + e.message + ")."
        : "Cannot sign in: " + e.message + ".";
      return this.showLogin(remembered && e.status === 401 ? "Your saved token is no longer valid." : msg);
    }
    saveToken(token);
    api.onUnauthorized = () => { forgetToken(); this.showLogin("Your token was rejected; sign in again."); };
    this.api = api;
    $("whoami").textContent = who.user + " · " + who.role + (who.team ? " · team " + who.team : "");
    $("login").hidden = true;
    $("shell").hidden = false;
    this.poller = new Poller(() => this.tick(), POLL_MS, (state, err) => this.liveState(state, err));
    this.route(false);
    this.poller.start();
  }

  logout() {
    forgetToken();
    this.showLogin("");
  }

  route(kick = true) {
    if (!this.api) return;
    const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
    const name = VIEWS[parts[0]] ? parts[0] : "overview";
    for (const a of document.querySelectorAll(".nav a")) a.classList.toggle("active", a.dataset.view === name);
    this.view = VIEWS[name](this.api, parts[1]);
    // Each view draws into its own box: a refresh of the view left behind that is still
    // in flight then fills a detached box, never the new view's page.
    const box = document.createElement("div");
    $("view").replaceChildren(box);
    this.view.mount(box);
    document.title = "aicluster · " + name + (parts[1] ? " " + parts[1].slice(0, 8) : "");
    if (kick && this.poller) this.poller.kick();
  }

  async tick() {
    const view = this.view;
    if (view) await view.refresh();
  }

  liveState(state, err) {
    const live = $("live");
    const banner = $("banner");
    live.className = "live " + state;
    if (state === "live") {
      live.textContent = "live · " + clock(Date.now() / 1000);
      banner.hidden = true;
    } else if (state === "paused") {
      live.textContent = "paused (tab hidden)";
    } else {
      live.textContent = "error";
      banner.textContent = (err && err.message) || String(err);
      banner.hidden = false;
    }
  }
}

document.addEventListener("DOMContentLoaded", () => new Dashboard().init());
