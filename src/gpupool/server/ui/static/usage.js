// Usage: the chargeback table (GET /usage): device-hours, memory GiB-hours, cost, and what the same
// work would have cost on whole dedicated devices; downloadable as CSV.

import { get } from "./api.js";
import { h, table, update } from "./dom.js";
import { deviceHours, gibHours, money } from "./money.js";

const KEYS = ["tenant", "queue", "model", "priority_class", "node", "day"];
const NUMBERS = ["pods", "device_hours", "memory_gib_hours", "cost", "dedicated_cost", "saving"];
const EVERY_MS = 10000; // metering a long history is costly for the server: not on every poll
const RANGES = [["1", "last 24 hours"], ["7", "last 7 days"], ["30", "last 30 days"]];

export function title() { return "Usage"; }

/** A figure of a usage row as `gpupool usage` prints it, amounts in the answer's currency. */
function figure(name, v, currency) {
  if (name === "pods") return String(v);
  if (name === "device_hours") return deviceHours(v);
  if (name === "memory_gib_hours") return gibHours(v);
  return money(v, currency);
}

export function mount(root, ctx) {
  const state = { by: ["tenant"], days: "30" };
  let last = null;
  const out = h("div", { id: "usage-table" });
  const download = h("button", { type: "button", id: "usage-csv", onclick: () => last && save(last) }, "Download CSV");
  const range = h("select", { id: "usage-range", onchange: () => { state.days = range.value; refresh(); } },
    RANGES.map(([v, t]) => h("option", { value: v, selected: v === state.days }, t)));
  const boxes = KEYS.map((key) => {
    const box = h("input", { type: "checkbox", id: "by-" + key, checked: state.by.includes(key) });
    box.addEventListener("change", () => {
      state.by = KEYS.filter((k) => document.getElementById("by-" + k).checked);
      refresh();
    });
    return h("label", { class: "check", for: "by-" + key }, box, key.replace("_", " "));
  });
  root.append(h("h1", {}, "Usage"),
    h("form", { class: "filters", "aria-label": "Usage grouping and period", onsubmit: (e) => e.preventDefault() },
      h("label", { for: "usage-range" }, "Period"), range,
      h("fieldset", { class: "inline" }, h("legend", {}, "Group by"), boxes), download),
    out);

  let fetched = { at: 0, ask: "" };
  async function refresh() {
    const ask = JSON.stringify(state);
    if (ask === fetched.ask && Date.now() - fetched.at < EVERY_MS) return;
    fetched = { at: Date.now(), ask };
    const until = Date.now() / 1000;
    const usage = await get("usage", { by: (state.by.length ? state.by : ["tenant"]).join(","),
      since_s: Math.floor(until - Number(state.days) * 86400) });
    last = usage;
    const keys = usage.by;
    update(out, [usage.by, usage.rows, usage.total, usage.currency], () => {
      const t = table(`Metered use and its cost (${usage.currency}); simulated devices are metered apart`,
        [...keys, "simulated", "pods", "device-hours", "memory GiB-hours", "cost", "on dedicated devices", "saving"],
        usage.rows.map((r) => [...keys.map((k) => r[k] ?? ""), r.simulated ? "yes" : "",
          ...NUMBERS.map((n) => h("span", { "data-field": n }, figure(n, r[n], usage.currency))) ]),
        "no metered use in this period");
      if (usage.rows.length > 1) { // the API's total: a pod in two rows (two days) is one pod, not two
        t.appendChild(h("tfoot", {}, h("tr", {}, h("th", { scope: "row", colspan: keys.length + 1 }, "total"),
          NUMBERS.map((n) => h("td", { "data-field": n }, figure(n, usage.total[n], usage.currency))))));
      }
      return t;
    });
  }
  return refresh;
}

function save(usage) {
  const header = [...usage.by, "simulated", ...NUMBERS, "currency"];
  const quote = (v) => { const s = String(v ?? ""); return /[",\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s; };
  const lines = [header.join(",")].concat(usage.rows.map((r) =>
    [...usage.by.map((k) => r[k]), r.simulated, ...NUMBERS.map((n) => r[n]), usage.currency].map(quote).join(",")));
  const blob = new Blob([lines.join("\n") + "\n"], { type: "text/csv" });
  const a = h("a", { href: URL.createObjectURL(blob), download: "gpupool-usage.csv" });
  document.body.appendChild(a);
  a.click();
  setTimeout(() => { URL.revokeObjectURL(a.href); a.remove(); }, 0);
}
