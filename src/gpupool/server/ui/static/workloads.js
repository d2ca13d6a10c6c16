// Workloads: a filterable, paged table; each row links to the workload's own page. The tasks of an
// array are one row with their counts by status (expand it to see them).

import { get } from "./api.js";
import { duration, h, link, replace, statusBadge, table, update, when } from "./dom.js";

const PAGE = 50;
const STATUSES = ["", "pending", "admitted", "running", "succeeded", "failed", "cancelled"];

export function title() { return "Workloads"; }

export function mount(root, ctx) {
  const state = { status: "", tenant: "", queue: "", name: "", idPrefix: "", offset: 0, expanded: new Set() };
  const out = h("div", { id: "workload-table" });
  const pager = h("p", { class: "pager" });
  const field = (id, text, key, extra) => {
    const input = h("input", { id, type: "search", autocomplete: "off", spellcheck: "false", ...extra });
    input.addEventListener("input", () => { state[key] = input.value.trim(); state.offset = 0; soon(); });
    return [h("label", { for: id }, text), input];
  };
  const status = h("select", { id: "wl-status" }, STATUSES.map((s) => h("option", { value: s }, s || "any")));
  status.addEventListener("change", () => { state.status = status.value; state.offset = 0; soon(); });
  root.append(h("h1", {}, "Workloads"),
    h("form", { class: "filters", role: "search", "aria-label": "Filter workloads", onsubmit: (e) => e.preventDefault() },
      h("label", { for: "wl-status" }, "Status"), status,
      ctx.me.admin ? field("wl-tenant", "Tenant", "tenant") : "",
      field("wl-queue", "Queue", "queue"),
      field("wl-name", "Name", "name"),
      field("wl-id", "Id starts with", "idPrefix")),
    out, pager);

  let timer = null;
  let problem = "";
  const soon = () => { clearTimeout(timer); timer = setTimeout(() => refresh().catch(() => {}), 250); };

  async function refresh() {
    let page;
    try {
      page = await get("workloads", { status: state.status, tenant: state.tenant, queue: state.queue,
        name: state.name, id_prefix: state.idPrefix, limit: PAGE, offset: state.offset });
      problem = "";
    } catch (err) {
      if (err.status !== 404 && err.status !== 422) throw err;
      problem = err.message; // an unknown tenant or queue in the filter: say so in place
      page = { items: [], total: 0, offset: 0 };
    }
    const tick = Math.floor(Date.now() / 10000); // elapsed times move on every 10 s
    update(out, [page.items, problem, [...state.expanded], tick], () => [
      problem ? h("p", { class: "error", role: "status" }, problem) : "",
      table(`Workloads ${page.total ? page.offset + 1 : 0}-${page.offset + page.items.length} of ${page.total}`,
        ["Workload", "Name", "Tenant", "Queue", "Status", "Priority", "Class", "Devices", "Node", "Submitted", "Elapsed", "Why"],
        rows(page.items, state.expanded, () => refresh().catch(() => {})), "no workloads match")]);
    update(pager, [page.offset, page.total], () => [
      h("button", { type: "button", disabled: state.offset === 0,
        onclick: () => { state.offset = Math.max(0, state.offset - PAGE); soon(); } }, "Newer"),
      " ",
      h("button", { type: "button", disabled: state.offset + PAGE >= page.total,
        onclick: () => { state.offset += PAGE; soon(); } }, "Older")]);
  }
  return refresh;
}

/** The table's rows: one per workload, and one per array (its tasks on this page) with the counts of
 * its tasks by status, followed by the tasks themselves when expanded. */
export function rows(items, expanded, redraw) {
  const arrays = new Map();
  for (const w of items) {
    if (!w.array_id) continue;
    if (!arrays.has(w.array_id)) arrays.set(w.array_id, []);
    arrays.get(w.array_id).push(w);
  }
  const out = [];
  const seen = new Set();
  for (const w of items) {
    if (!w.array_id) { out.push(row(w)); continue; }
    if (seen.has(w.array_id)) continue;
    seen.add(w.array_id);
    const tasks = arrays.get(w.array_id);
    const open = expanded.has(w.array_id);
    const counts = new Map();
    for (const t of tasks) counts.set(t.status, (counts.get(t.status) || 0) + 1);
    const toggle = h("button", { type: "button", class: "expand", "aria-expanded": open ? "true" : "false",
      "aria-label": `${open ? "Hide" : "Show"} the tasks of array ${w.array_id}`,
      onclick: () => { if (open) expanded.delete(w.array_id); else expanded.add(w.array_id); redraw(); } }, open ? "−" : "+");
    const nodes = [...new Set(tasks.flatMap((t) => t.pods.map((p) => p.node)))];
    out.push({ attrs: { class: "array-row", "data-array": w.array_id }, cells: [
      h("span", {}, toggle, " ", `array ${w.array_id}`), `${tasks.length} tasks`, w.tenant, w.queue,
      h("span", { class: "counts" }, [...counts.entries()].map(([st, n]) => h("span", { "data-status": st }, statusBadge(st), ` ${n} `))),
      String(w.priority), w.request.priority_class || "", devices(w), nodes.join(", "), when(Math.min(...tasks.map((t) => t.submit_s))), "", ""] });
    if (open) for (const t of tasks) out.push({ attrs: { class: "array-task", "data-array-task": w.array_id }, cells: row(t) });
  }
  return out;
}

function row(w) {
  const now = Date.now() / 1000;
  let elapsed = "";
  if (w.started_s) elapsed = duration((w.finished_s || now) - w.started_s);
  else if (w.status === "pending") elapsed = "waiting " + duration(now - w.submit_s);
  return [link("workloads/" + w.id, w.id), w.name, w.tenant, w.queue, statusBadge(w.status), String(w.priority),
    w.request.priority_class || "", devices(w), [...new Set(w.pods.map((p) => p.node))].join(", "),
    when(w.submit_s), elapsed, w.status === "pending" || w.reason_final ? (w.reason_text || w.reason) : ""];
}

function devices(w) {
  const r = w.request.resources || {};
  const n = r.gpus || 0;
  if (!n) return "";
  return (w.request.replicas > 1 ? `${w.request.replicas} × ` : "") + String(n) + (r.gpu_memory ? ` (${r.gpu_memory})` : "");
}
