// Workloads: a filterable, paged table; each row links to the workload's own page.

import { get } from "./api.js";
import { h, link, replace, statusBadge, table, update, when } from "./dom.js";

const PAGE = 50;
const STATUSES = ["", "pending", "admitted", "running", "succeeded", "failed", "cancelled"];

export function title() { return "Workloads"; }

export function mount(root, ctx) {
  const state = { status: "", tenant: "", queue: "", name: "", idPrefix: "", offset: 0 };
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
    update(out, [page.items, problem], () => [
      problem ? h("p", { class: "error", role: "status" }, problem) : "",
      table(`Workloads ${page.total ? page.offset + 1 : 0}-${page.offset + page.items.length} of ${page.total}`,
        ["Workload", "Name", "Tenant", "Queue", "Status", "Priority", "Devices", "Submitted", "Why"],
        page.items.map((w) => [
          link("workloads/" + w.id, w.id), w.name, w.tenant, w.queue, statusBadge(w.status), String(w.priority),
          devices(w), when(w.submit_s), w.status === "pending" || w.reason_final ? (w.reason_text || w.reason) : "",
        ]), "no workloads match")]);
    update(pager, [page.offset, page.total], () => [
      h("button", { type: "button", disabled: state.offset === 0,
        onclick: () => { state.offset = Math.max(0, state.offset - PAGE); soon(); } }, "Newer"),
      " ",
      h("button", { type: "button", disabled: state.offset + PAGE >= page.total,
        onclick: () => { state.offset += PAGE; soon(); } }, "Older")]);
  }
  return refresh;
}

function devices(w) {
  const r = w.request.resources || {};
  const n = r.gpus || 0;
  if (!n) return "";
  return (w.request.replicas > 1 ? `${w.request.replicas} × ` : "") + String(n) + (r.gpu_memory ? ` (${r.gpu_memory})` : "");
}
