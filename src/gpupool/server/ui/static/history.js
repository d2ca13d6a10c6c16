// The pool's history as the store keeps it (GET /history): charts over the last hour, day or week
// (the admin: allocation against capacity, pending demand, each tenant's devices; a tenant: its own
// devices), and the admin's table of each device's allocation beside its measured utilisation, where
// idle-but-allocated devices stand out. Simulated devices are never measured, and say so.

import { get } from "./api.js";
import { h, table, tenantClass, update } from "./dom.js";
import { lineChart } from "./chart.js";

const RANGES = ["1h", "24h", "7d"];
const EVERY_MS = 30000; // the store holds one point a minute: asking more often shows nothing new
const DEVICES_EVERY_MS = 300000; // each device's means: 8,000 rows a minute at 1,000 nodes, asked seldom
let chosen = "1h"; // kept across visits of the page

export function mountHistory(section, me) {
  const buttons = RANGES.map((r) => h("button", { type: "button", "data-range": r, "aria-pressed": r === chosen ? "true" : "false",
    onclick: () => { chosen = r; for (const b of buttons) b.setAttribute("aria-pressed", b.dataset.range === r ? "true" : "false"); last = 0; lastDevices = 0; } }, r));
  const charts = h("div", { id: "history-charts" });
  const devices = h("div", { id: "history-devices" });
  section.append(h("h2", { id: "h-history" }, "History", h("span", { class: "ranges", role: "group", "aria-label": "Range" }, buttons)),
    charts, me.admin ? devices : "");
  let last = 0;
  let lastDevices = 0;
  return async () => {
    if (Date.now() - last < EVERY_MS) return;
    last = Date.now();
    const range = chosen;
    if (!me.admin) {
      const mine = await get("history", { metric: "tenants", range });
      update(charts, [mine.series, range], () => tenantChart(mine, "Your tenant's devices"));
      return;
    }
    const askDevices = Date.now() - lastDevices >= DEVICES_EVERY_MS;
    if (askDevices) lastDevices = Date.now();
    const [alloc, pending, tenants, devs] = await Promise.all(["allocation", "pending", "tenants", askDevices ? "devices" : ""]
      .map((metric) => (metric ? get("history", { metric, range }) : null)));
    update(charts, [alloc.series, pending.series, tenants.series, range], () => {
      const capacity = alloc.series.find((s) => s.name === "capacity");
      const top = Math.max(1, ...(capacity ? capacity.values.map((v) => v[1]) : [1]));
      const allocated = alloc.series.find((s) => s.name === "allocated");
      const demand = pending.series.find((s) => s.name === "pending");
      return [
        drawn([{ name: "allocated", cls: "total", values: allocated ? allocated.values : [] },
          { name: "capacity", cls: "t9", values: capacity ? capacity.values : [] },
          { name: "pending demand", cls: "t1", values: demand ? demand.values : [] }],
        Math.max(top, ...(demand ? demand.values.map((v) => v[1]) : [0])),
        `Devices allocated, capacity and pending demand over the last ${range}`, "history-allocation"),
        tenantChart(tenants, "Devices allocated by tenant"),
      ];
    });
    if (devs) update(devices, [devs.devices], () => deviceTable(devs));
  };
}

function drawn(series, yMax, label, id) {
  if (!series.some((s) => s.values.length)) return h("p", { class: "summary", id }, "No history yet: the pool is sampled once a minute.");
  const figure = lineChart(series.filter((s) => s.values.length), yMax, label);
  figure.id = id;
  return figure;
}

function tenantChart(out, title) {
  const series = out.series.map((s) => ({ name: s.name, cls: tenantClass(s.name), values: s.values }));
  const top = Math.max(1, ...series.flatMap((s) => s.values.map((v) => v[1])));
  return [h("h3", {}, title), drawn(series, top, `${title} over the last ${out.range}`, "history-tenants")];
}

function deviceTable(out) {
  const rows = [...out.devices].sort((a, b) => idleness(b) - idleness(a));
  return table(`Each device over the last ${out.range}: allocation against measured utilisation (idle but allocated first)`,
    ["Device", "Allocated (mean)", "Utilisation (mean)", "Memory used (mean)"],
    rows.map((d) => ({ attrs: { "data-device": `${d.node}/${d.index}` }, cells: [
      `${d.node} / ${d.index}`, `${Math.round(d.allocated * 100)} %`,
      d.busy_pct !== null ? `${Math.round(d.busy_pct)} %` : (d.simulated ? "simulated: not measured" : "not measured"),
      d.memory_used_mib !== null ? `${Math.round(d.memory_used_mib)} MiB` : "",
    ] })), "no history yet");
}

/** How much a device is allocated but not busy (only measured devices can be idle). */
function idleness(d) {
  if (d.busy_pct === null) return -1;
  return d.allocated * (1 - d.busy_pct / 100);
}
