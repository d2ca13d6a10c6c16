// Queues and tenants: each queue's nominal quota, what it uses, borrows and lends, its weight;
// and the tenants with their limits and budgets (spent this period against the budget, the warn
// fraction marked, exhausted said in words).

import { get } from "./api.js";
import { bar, gpus, h, table, update } from "./dom.js";
import { money as amount } from "./money.js";

export function title() { return "Queues and tenants"; }

const limit = (v) => (v === null || v === undefined ? "none" : gpus(v));

export function mount(root) {
  const queues = h("section", { "aria-labelledby": "h-queues" });
  const tenants = h("section", { "aria-labelledby": "h-tenants" });
  root.append(h("h1", {}, "Queues and tenants"), queues, tenants);
  return async () => {
    const [qs, ts] = await Promise.all([get("queues"), get("tenants")]);
    update(queues, qs, () => [h("h2", { id: "h-queues" }, "Queues"), table("Quota and use of each queue, in devices",
      ["Tenant", "Queue", "Cohort", "Weight", "Nominal", "Used", "Borrowed", "Lent", "May borrow", "May lend",
        "Running", "Pending", "Reserved for"],
      qs.map((q) => [q.tenant, q.name, q.cohort || "", String(q.weight), limit(q.quota_gpus),
        h("span", { class: "meter" }, q.quota_gpus ? bar(`${gpus(q.used_gpus)} of ${gpus(q.quota_gpus)} devices used`,
          [[Math.min(q.used_gpus, q.quota_gpus) / q.quota_gpus, "used"]]) : "", " ", gpus(q.used_gpus)),
        gpus(q.borrowed_gpus), gpus(q.lent_gpus), limit(q.borrowing_limit_gpus), limit(q.lending_limit_gpus),
        String(q.running), String(q.pending), q.reserved_workload || ""]), "no queues")]);
    update(tenants, ts, () => [h("h2", { id: "h-tenants" }, "Tenants"), table("Tenants and their limits",
      ["Tenant", "Queues", "Highest priority", "Most pending", "Unix account", "Budget this period"],
      ts.map((t) => [t.name, t.queues.join(", "), String(t.max_priority), String(t.max_pending), t.unix_user || "",
        budget(t)]),
      "no tenants")]);
  };
}

/** A budget's amount as `gpupool tenant ls` shows it, in the price book's currency (money.js). */
const money = (v, currency) => amount(v, currency || "USD");

/** A tenant's budget: a progress bar of its spend with the warn fraction marked, and the same in words. */
function budget(t) {
  if (t.budget === null || t.budget === undefined) return "none";
  const per = `per ${t.budget_period}`;
  if (t.spent === null || t.spent === undefined) return h("span", { class: "budget" }, `${money(t.budget, t.currency)} ${per} (spend not yet counted)`);
  const ratio = t.budget > 0 ? t.spent / t.budget : 1;
  const pct = Math.round(ratio * 100);
  const state = t.budget_exhausted ? "exhausted" : ratio >= 1 ? "spent, overdraft allowed"
    : ratio >= t.budget_warn ? "warned" : "";
  const label = `Budget of ${t.name}: ${money(t.spent, t.currency)} of ${money(t.budget, t.currency)} spent ${per} (${pct} %)` +
    (state ? `, ${state}` : "");
  const cls = t.budget_exhausted ? "exhausted" : ratio >= t.budget_warn ? "warn" : "used";
  const mark = h("span", { class: "mark", title: `warned at ${Math.round(t.budget_warn * 100)} %`, "aria-hidden": "true" });
  mark.style.left = (Math.min(1, t.budget_warn) * 100).toFixed(2) + "%";
  const fill = h("span", { class: "seg " + cls });
  fill.style.width = (Math.max(0, Math.min(1, ratio)) * 100).toFixed(2) + "%";
  const bar = h("div", { class: "bar budgetbar", role: "progressbar", "aria-label": label, title: label,
    "aria-valuemin": "0", "aria-valuemax": String(t.budget), "aria-valuenow": String(Math.min(t.spent, t.budget)),
    "aria-valuetext": `${pct} % spent` + (state ? `, ${state}` : "") }, fill, mark);
  return h("span", { class: "meter budget", "data-tenant": t.name }, bar, " ",
    h("span", { "data-field": "spent" }, money(t.spent, t.currency)), " of ", h("span", { "data-field": "budget" }, money(t.budget, t.currency)),
    ` ${per} (${pct} %)`,
    state ? h("span", { class: "badge budget-" + cls, "data-field": "state" }, state) : "",
    t.overdraft && !state ? h("span", { class: "badge" }, "overdraft allowed") : "");
}
