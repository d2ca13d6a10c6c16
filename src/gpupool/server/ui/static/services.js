// Services: the tenant's inference services (the admin's: every tenant's) with their state, replicas
// ready of desired, and the router's requests/s and requests in flight now; each links to its page.

import { get } from "./api.js";
import { h, link, statusBadge, table, update } from "./dom.js";

export function title() { return "Services"; }

export function mount(root, ctx) {
  const out = h("div", { id: "service-table" });
  root.append(h("h1", {}, "Services"), out);
  return async () => {
    const services = await get("services");
    update(out, services, () => table("Inference services: replicas ready of desired, and the router's traffic now",
      [...(ctx.me.admin ? ["Tenant"] : []), "Service", "State", "Replicas ready / desired", "Requests/s", "In flight"],
      services.map((s) => ({ attrs: { "data-service": `${s.tenant}/${s.name}` }, cells: [
        ...(ctx.me.admin ? [s.tenant] : []),
        link(servicePath(s, ctx.me), s.name), statusBadge(s.state),
        `${s.ready_replicas} / ${s.desired}`,
        s.live ? s.live.requests_per_s.toFixed(1) : "no router",
        s.live ? String(s.live.in_flight) : "",
      ] })), "no services: `gpupool service create` starts one"));
  };
}

/** The page of a service: /ui/services/<name>, with ?tenant= for the admin (names are unique per tenant). */
export function servicePath(s, me) {
  return `services/${encodeURIComponent(s.name)}` + (me.admin ? `?tenant=${encodeURIComponent(s.tenant)}` : "");
}
