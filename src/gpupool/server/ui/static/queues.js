// Queues and tenants: each queue's nominal quota, what it uses, borrows and lends, its weight;
// and the tenants with their limits.

import { get } from "./api.js";
import { bar, gpus, h, table, update } from "./dom.js";

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
      ["Tenant", "Queues", "Highest priority", "Most pending", "Unix account"],
      ts.map((t) => [t.name, t.queues.join(", "), String(t.max_priority), String(t.max_pending), t.unix_user || ""]),
      "no tenants")]);
  };
}
