// DOM and formatting helpers. Every string from the server becomes a text node:
// nothing here ever assigns innerHTML, so server text cannot become markup.

export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "testid") el.setAttribute("data-testid", value);
    else if (key === "data") for (const [k, v] of Object.entries(value)) el.dataset[k] = String(v);
    else if (typeof value === "function" && key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key.startsWith("on")) throw new Error("event handlers must be functions");
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else if (child instanceof Node) el.appendChild(child);
    else el.appendChild(document.createTextNode(String(child)));
  }
}

export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

// A link inside the app (hash routes); parts are URI-encoded.
export function route(...parts) {
  return "#/" + parts.map((p) => encodeURIComponent(String(p))).join("/");
}

// A link only for http(s) URLs; anything else is shown as plain text.
export function extLink(url, props) {
  if (typeof url === "string" && /^https?:\/\//i.test(url)) {
    return h("a", { href: url, target: "_blank", rel: "noopener noreferrer", ...props }, url);
  }
  return h("span", props, url || "—");
}

export function num(x) {
  if (x === null || x === undefined || Number.isNaN(Number(x))) return "—";
  const n = Number(x);
  return Number.isInteger(n) ? String(n) : String(Math.round(n * 100) / 100);
}

export function bytes(n) {
  if (!n) return "0";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = Number(n);
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return (Number.isInteger(v) ? v : v.toFixed(1)) + " " + units[i];
}

export function clock(ts) {
  if (!ts) return "—";
  const d = new Date(ts * 1000);
  return d.toLocaleTimeString([], { hour12: false });
}

export function stamp(ts) {
  if (!ts) return "—";
  const d = new Date(ts * 1000);
  const pad = (x) => String(x).padStart(2, "0");
  const day = d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate());
  return day + " " + d.toLocaleTimeString([], { hour12: false });
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined || seconds < 0) return "—";
  const s = Math.floor(seconds);
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
  if (s < 86400) return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
  return Math.floor(s / 86400) + "d " + Math.floor((s % 86400) / 3600) + "h";
}

export function since(ts) {
  return ts ? duration(Date.now() / 1000 - ts) : "—";
}

export function shortId(id) {
  return id ? String(id).slice(0, 8) : "—";
}

// A status pill; the class is picked from a fixed list, the text is the status.
const TONES = {
  SUCCEEDED: "ok", READY: "ok", Ready: "ok", RUNNING: "run", STARTING: "run", ADMITTED: "run",
  PENDING: "wait", Draining: "warn", Cordoned: "warn", Degraded: "warn",
  FAILED: "bad", Down: "bad", CANCELLED: "off", STOPPED: "off",
};

export function badge(status, testid) {
  const tone = TONES[status] || "off";
  return h("span", { class: "badge " + tone, testid }, status || "—");
}

// A table: columns [{title, cls}], rows already built as <tr> elements.
export function table(columns, rows, props) {
  const head = h("tr", null, columns.map((c) => h("th", { class: c.cls }, c.title)));
  const body = rows.length
    ? rows
    : [h("tr", { class: "empty" }, h("td", { colspan: columns.length }, "nothing here"))];
  return h("table", props, h("thead", null, head), h("tbody", null, body));
}

export function stat(label, value, testid, tone) {
  return h("div", { class: "stat " + (tone || "") },
    h("div", { class: "stat-value", testid }, value),
    h("div", { class: "stat-label" }, label));
}

// A horizontal bar of parts [{value, tone, label}] out of total; widths via CSSOM.
export function bar(parts, total) {
  const el = h("div", { class: "bar", title: parts.map((p) => p.label + ": " + num(p.value)).join(", ") });
  for (const p of parts) {
    const seg = h("span", { class: "seg " + p.tone });
    seg.style.width = total > 0 ? (100 * p.value) / total + "%" : "0%";
    el.appendChild(seg);
  }
  return el;
}

export function section(title, ...children) {
  return h("section", { class: "panel" }, h("h2", null, title), children);
}
