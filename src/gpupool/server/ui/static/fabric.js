// Fabric: the InfiniBand topology the pool runs on (GET /api/v1/fabric). Switches drawn by level (the
// highest tier on top, the leaves above the pool's nodes), every cable coloured by its state and load,
// and the path of a chosen running workload (?workload=ID); the same cables as a table, for reading
// and for the keyboard. A pool started without --fabric says so.

import { ApiError, get } from "./api.js";
import { h, table, update } from "./dom.js";

const NS = "http://www.w3.org/2000/svg";
const BOX_W = 124;
const BOX_H = 26;
const GAP = 12;
const ROW_H = 96;
const LABEL_W = 118;
const TOP = 12;
const MANY_CABLES = 60; // more cables than this: the table starts with the notable ones only

export function title() { return "Fabric"; }

function svg(tag, attrs, text) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

/** What a cable's state is called (and its colour class). */
function cableState(link) {
  if (link.failed) return ["failed", "lk-failed"];
  if (link.degraded) return ["degraded", "lk-degraded"];
  if (link.load >= 0.8) return ["congested", "lk-hot"];
  if (link.load >= 0.5) return ["busy", "lk-busy"];
  return ["healthy", "lk-ok"];
}

const pct = (v) => `${Math.round(v * 100)} %`;
const gbps = (v) => `${Math.round(v * 10) / 10} Gb/s`;
const short = (name) => (name.length > 17 ? "…" + name.slice(-16) : name);

export function mount(root, ctx) {
  const state = { workload: "", notableOnly: null };
  const gangSelect = h("select", { id: "fabric-gang", onchange: () => { state.workload = gangSelect.value; rerun(); } });
  const notable = h("input", { id: "fabric-notable", type: "checkbox",
    onchange: () => { state.notableOnly = notable.checked; redrawTable(); } });
  const summary = h("p", { class: "summary", id: "fabric-summary", "aria-live": "polite" });
  const picture = h("div", { class: "fabric-wrap", id: "fabric-picture" });
  const gangFacts = h("section", { "aria-labelledby": "h-gang", id: "fabric-gang-facts" });
  const cables = h("section", { "aria-labelledby": "h-cables" });
  const legend = h("ul", { class: "legend", "aria-label": "Cable colours" },
    [["lk-ok", "healthy (load under 50 %)"], ["lk-busy", "busy (50 % or more)"], ["lk-hot", "congested (80 % or more)"],
      ["lk-degraded", "degraded (below its usual width or speed)"], ["lk-failed", "failed"],
      ["lk-path", "the chosen workload's path"]].map(([cls, text]) =>
      h("li", {}, h("span", { class: "cable-swatch " + cls, "aria-hidden": "true" }), text)));
  const body = h("div", {}, h("div", { class: "filters" },
    h("label", { for: "fabric-gang" }, "Show the path of"), gangSelect,
    h("label", { class: "check" }, notable, " list only cables that failed, are degraded, carry load or the path")),
  summary, legend, picture, gangFacts, cables);
  const absent = h("p", { class: "summary", id: "fabric-absent", hidden: true });
  root.append(h("h1", {}, "Fabric"), absent, body);
  let last = null;
  const rerun = () => { load().catch(() => { /* the next poll shows the error */ }); };

  function redrawTable() {
    if (!last) return;
    const { fabric } = last;
    const onPath = new Set(fabric.gang ? fabric.gang.links : []);
    const only = state.notableOnly === null ? fabric.links.length > MANY_CABLES : state.notableOnly;
    notable.checked = only;
    const shown = fabric.links.filter((l) => !only || l.failed || l.degraded || l.load >= 0.05 || onPath.has(l.id));
    update(cables, [shown, [...onPath]], () => [h("h2", { id: "h-cables" }, "Cables"), table(
      `Cables: ${shown.length} of ${fabric.links.length} shown`,
      ["Cable", "From", "To", "Kind", "Rate", "State", "Load", "Left", "Gangs"],
      shown.map((l) => {
        const [word, cls] = cableState(l);
        return [h("code", {}, l.id), `${l.a} port ${l.a_port}`, `${l.b} port ${l.b_port}`, l.kind,
          `${l.width_speed} (${gbps(l.data_rate_gbps)})`,
          h("span", { class: "badge " + cls, "data-link": l.id, "data-state": word }, word,
            onPath.has(l.id) ? ", on the path" : ""),
          pct(l.load), gbps(l.available_gbps), String(l.gangs)];
      }), "no cables")]);
    for (const row of cables.querySelectorAll("tbody tr")) {
      const badge = row.querySelector("[data-link]");
      if (badge && onPath.has(badge.dataset.link)) row.classList.add("on-path");
    }
  }

  function draw(fabric, running) {
    absent.hidden = true;
    body.hidden = false;
    const ids = running.map((w) => w.id);
    update(gangSelect, [ids, state.workload], () => [h("option", { value: "" }, "no workload"),
      running.map((w) => h("option", { value: w.id, selected: w.id === state.workload },
        w.name ? `${w.id} (${w.name})` : w.id))]);
    const failed = fabric.links.filter((l) => l.failed).length;
    const degraded = fabric.links.filter((l) => l.degraded).length;
    const busy = fabric.links.filter((l) => !l.failed && l.load >= 0.5).length;
    summary.textContent = `${fabric.switches.length} switches in ${fabric.levels.length} levels ` +
      `(${fabric.levels.map((l) => `${l.switches} ${l.tier}`).join(", ")}), ${fabric.nodes.length} nodes, ` +
      `${fabric.links.length} cables: ${failed} failed, ${degraded} degraded, ${busy} busy or congested. ` +
      `From ${fabric.source.split("/").pop()}.`;
    update(picture, fabric, () => picture_of(fabric));
    update(gangFacts, fabric.gang, () => gangOf(fabric.gang));
    redrawTable();
  }

  let none = ctx && ctx.me && !ctx.me.fabric ? "This pool runs without a fabric; start it with "
    + "`gpupool up --fabric FILE` (ibnetdiscover output or a `gpupool fabric generate` file)." : "";
  async function load() {
    if (none) { // a pool without a fabric: said once, never asked again every second
      body.hidden = true;
      absent.hidden = false;
      absent.textContent = none;
      return;
    }
    let fabric;
    try {
      fabric = await get("fabric", { workload: state.workload || null });
    } catch (err) {
      if (err instanceof ApiError && err.status === 409) {
        none = err.message;
        return load();
      }
      if (err instanceof ApiError && err.status === 404 && state.workload) { state.workload = ""; return; }
      throw err;
    }
    const running = (await get("workloads", { status: "running", limit: 200 })).items;
    last = { fabric, running };
    draw(fabric, running);
  }
  return load;
}

/** The drawing: one row per switch level, highest first, then the pool's nodes; cables between. */
function picture_of(fabric) {
  const levels = [...new Set(fabric.switches.map((s) => s.level))].sort((a, b) => (b ?? 99) - (a ?? 99));
  const tierOf = new Map(fabric.levels.map((l) => [l.level, l.tier]));
  const rows = levels.map((level) => ({
    label: level === null ? "unreached" : `${tierOf.get(level) || "level " + level} (${level})`,
    items: fabric.switches.filter((s) => s.level === level).map((s) => ({ key: s.name, text: s.name, kind: "sw" }))
      .sort((a, b) => a.key.localeCompare(b.key)),
  }));
  const leafOrder = new Map((rows.length ? rows[rows.length - 1].items : []).map((s, i) => [s.key, i]));
  const nodes = [...fabric.nodes].sort((a, b) => ((leafOrder.get(a.ports[0]?.leaf) ?? 1e9) - (leafOrder.get(b.ports[0]?.leaf) ?? 1e9))
    || a.node.localeCompare(b.node));
  rows.push({ label: "nodes", items: nodes.map((n) => ({ key: n.node, text: n.node, kind: "nd", title: `${n.node} (host ${n.host}, leaf ${n.leaf})` })) });
  const widest = Math.max(1, ...rows.map((r) => r.items.length));
  const width = LABEL_W + widest * (BOX_W + GAP);
  const height = 2 * TOP + (rows.length - 1) * ROW_H + BOX_H;
  const at = new Map();
  rows.forEach((row, r) => {
    const span = row.items.length * (BOX_W + GAP) - GAP;
    const left = LABEL_W + ((widest * (BOX_W + GAP) - GAP) - span) / 2;
    row.items.forEach((item, i) => at.set(item.key, { x: left + i * (BOX_W + GAP), y: TOP + r * ROW_H, item }));
  });
  const nodeOfAdapter = new Map();
  for (const n of fabric.nodes) for (const p of n.ports) nodeOfAdapter.set(p.adapter, n.node);
  const place = (end) => at.get(end) || at.get(nodeOfAdapter.get(end));
  const onPath = new Set(fabric.gang ? fabric.gang.links : []);
  const gangNodes = new Set(fabric.gang ? fabric.gang.nodes : []);
  const failed = fabric.links.filter((l) => l.failed).length;
  const label = `Fabric drawing: ${fabric.switches.length} switches and ${fabric.nodes.length} nodes; ` +
    `${failed} of ${fabric.links.length} cables failed` + (fabric.gang ? `; the path of ${fabric.gang.workload_id} is drawn in blue` : "");
  const root = svg("svg", { class: "fabric", viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "aria-label": label });
  root.appendChild(svg("title", {}, label));
  rows.forEach((row, r) => root.appendChild(svg("text", { x: 4, y: TOP + r * ROW_H + BOX_H / 2 + 4, class: "row-label" }, row.label)));
  const cables = svg("g", { class: "cables" });
  const path = svg("g", { class: "cables path" });
  for (const link of fabric.links) {
    const a = place(link.a);
    const b = place(link.b);
    if (!a || !b) continue;
    const [upper, lower] = a.y <= b.y ? [a, b] : [b, a];
    const [word, cls] = cableState(link);
    const line = svg("line", { x1: upper.x + BOX_W / 2, y1: upper.y + BOX_H, x2: lower.x + BOX_W / 2, y2: lower.y,
      class: "lk " + cls + (onPath.has(link.id) ? " lk-path" : ""), "data-link": link.id, "data-state": word });
    line.appendChild(svg("title", {}, `${link.id}: ${link.a} port ${link.a_port} to ${link.b} port ${link.b_port}, ` +
      `${link.width_speed}, ${word}, load ${pct(link.load)}, ${gbps(link.available_gbps)} left, ${link.gangs} gangs`));
    (onPath.has(link.id) ? path : cables).appendChild(line);
  }
  root.append(cables, path);
  for (const { x, y, item } of at.values()) {
    const g = svg("g", { class: "box " + item.kind + (gangNodes.has(item.key) ? " on-path" : ""), "data-name": item.key });
    g.appendChild(svg("title", {}, item.title || item.text));
    g.appendChild(svg("rect", { x, y, width: BOX_W, height: BOX_H, rx: 4 }));
    g.appendChild(svg("text", { x: x + BOX_W / 2, y: y + BOX_H / 2 + 4, "text-anchor": "middle" }, short(item.text)));
    root.appendChild(g);
  }
  return root;
}

function gangOf(gang) {
  if (!gang) return [];
  const facts = [["Workload", gang.workload_id], ["Nodes", gang.nodes.join(", ") || "none"],
    ["Spans", gang.domain], ["Hops", String(gang.hops)], ["Connected", gang.connected ? "yes" : "no: some nodes have no route left"],
    ["Bottleneck", gang.bottleneck ? `${gang.bottleneck} (${gbps(gang.bottleneck_gbps)} left)` : "none (one node)"],
    ["Cables", String(gang.links.length)]];
  return [h("h2", { id: "h-gang" }, "Path of " + gang.workload_id),
    h("dl", { class: "facts" }, facts.flatMap(([k, v]) => [h("dt", {}, k), h("dd", { "data-field": k.toLowerCase() }, v)]))];
}
