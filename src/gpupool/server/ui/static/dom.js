// Building the page safely: every piece of data becomes a text node or an attribute value, never
// markup (no HTML parsing of strings anywhere), so a workload's name, command or log cannot inject script.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
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

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

export function replace(el, ...children) {
  clear(el);
  append(el, children);
  return el;
}

/** A table with a caption, column headers and rows of cells (strings or nodes). */
export function table(caption, headers, rows, emptyText) {
  // a row is its cells, or { attrs, cells } for a row with attributes of its own
  const body = h("tbody", {}, rows.map((row) => Array.isArray(row)
    ? h("tr", {}, row.map((c) => h("td", {}, c)))
    : h("tr", row.attrs, row.cells.map((c) => h("td", {}, c)))));
  if (!rows.length) body.appendChild(h("tr", {}, h("td", { colspan: headers.length, class: "empty" }, emptyText || "none")));
  return h("table", {},
    h("caption", {}, caption),
    h("thead", {}, h("tr", {}, headers.map((t) => h("th", { scope: "col" }, t)))),
    body);
}

/** A link to another page of the dashboard (followed without a reload by the router). */
export function link(path, text) {
  return h("a", { href: "/ui/" + path.replace(/^\//, "") }, text);
}

/** A horizontal bar: `parts` are [fraction, css class, label] drawn left to right. */
export function bar(label, parts) {
  const el = h("div", { class: "bar", role: "img", "aria-label": label, title: label });
  for (const [fraction, cls, title] of parts) {
    const seg = h("span", { class: "seg " + (cls || ""), title: title || "" });
    seg.style.width = (Math.max(0, Math.min(1, fraction)) * 100).toFixed(2) + "%";
    el.appendChild(seg);
  }
  return el;
}

const PALETTE = ["t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8", "t9"];
const COLOURS_KEY = "gpupool.colours";

/** The colour class of a tenant: given in the order tenants are first seen in this tab and kept
 * for the tab's session, so the same tenant has the same colour on every page and the first ten
 * tenants all differ. */
export function tenantClass(tenant) {
  let known = {};
  try { known = JSON.parse(sessionStorage.getItem(COLOURS_KEY) || "{}"); } catch (err) { known = {}; }
  if (!(tenant in known)) {
    known[tenant] = Object.keys(known).length % PALETTE.length;
    sessionStorage.setItem(COLOURS_KEY, JSON.stringify(known));
  }
  return PALETTE[known[tenant]];
}

export function gpus(value) {
  return (Math.round(value * 1000) / 1000).toString();
}

export function mib(value) {
  return value >= 1024 ? (value / 1024).toFixed(value % 1024 ? 1 : 0) + " GiB" : value + " MiB";
}

export function when(epochS) {
  if (epochS === null || epochS === undefined) return "";
  return new Date(epochS * 1000).toLocaleTimeString();
}

export function ago(epochS) {
  if (!epochS) return "";
  const s = Math.max(0, Date.now() / 1000 - epochS);
  if (s < 60) return Math.round(s) + " s";
  if (s < 3600) return Math.round(s / 60) + " min";
  return (s / 3600).toFixed(1) + " h";
}

/** A duration in seconds, short: "42 s", "7 min", "3.5 h", "2.1 d". */
export function duration(s) {
  if (s === null || s === undefined || !(s >= 0)) return "";
  if (s < 60) return Math.round(s) + " s";
  if (s < 3600) return Math.round(s / 60) + " min";
  if (s < 86400) return (s / 3600).toFixed(1) + " h";
  return (s / 86400).toFixed(1) + " d";
}

export function statusBadge(status) {
  return h("span", { class: "badge st-" + status }, status);
}

/** Rebuild `el` from `data` only when the data changed, so a focused link or a selection in an
 * unchanged part of the page survives a poll. */
const drawn = new WeakMap();

export function update(el, data, build) {
  const key = JSON.stringify(data);
  if (drawn.get(el) === key) return false;
  drawn.set(el, key);
  replace(el, build(data));
  return true;
}

/** An action's button: a click asks for confirmation in a modal dialog saying what will happen;
 * only "Confirm" runs `act` (an async call); its outcome, or the server's sentence, is said in
 * `#action-result`, then `done` runs (a redraw). */
export function actionButton(label, sentence, act, done) {
  return h("button", { type: "button", class: "action", "data-action": label.toLowerCase(),
    onclick: () => confirmThen(sentence, act, done) }, label);
}

function confirmThen(sentence, act, done) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = sentence;
  const yes = document.getElementById("confirm-yes");
  const no = document.getElementById("confirm-no");
  const result = document.getElementById("action-result");
  const close = () => { yes.onclick = null; no.onclick = null; dialog.close(); };
  no.onclick = () => close();
  yes.onclick = async () => {
    close();
    result.textContent = "Working…";
    result.classList.remove("error");
    try {
      await act();
      result.textContent = "Done: " + sentence.replace(/\?$/, ".");
    } catch (err) {
      result.textContent = err.message || String(err);
      result.classList.add("error");
    }
    if (done) done();
  };
  dialog.showModal();
  no.focus();
}
