// Overview: what the pool holds now (by model, by tenant), how that moved over the last hour, day
// or week (history.js, from the store), the work that waits, with the reason the scheduler gave,
// and the cost so far this period.

import { get } from "./api.js";
import { bar, gpus, h, link, replace, table, tenantClass, update, when } from "./dom.js";
import { mountHistory } from "./history.js";
import { money } from "./money.js";

const COST_EVERY_MS = 10000; // metering costs the server more than the other routes: as on the usage page
let cost = { at: 0, who: "", since: 0, usage: null }; // the last cost asked, kept across visits of the page

/** The start of the current month, UTC, in epoch seconds: the period the cost card covers. */
export function monthStartS(now) {
  const d = new Date(now);
  return Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1) / 1000;
}

export function title() { return "Overview"; }

export function mount(root, ctx) {
  const cards = h("div", { class: "cards", "aria-label": "Pool totals" });
  const costCard = h("div", { class: "card", hidden: true });
  const models = h("section", { "aria-labelledby": "h-models" });
  const tenants = h("section", { "aria-labelledby": "h-tenants" });
  const chart = h("section", { "aria-labelledby": "h-history" });
  const pending = h("section", { "aria-labelledby": "h-pending" });
  const members = h("section", { "aria-labelledby": "h-members", id: "members", hidden: true }); // a hub's members
  const leader = h("p", { class: "leader", id: "leader", hidden: true }); // admins: who schedules (docs/ha.md)
  root.append(h("h1", {}, "Overview"), leader, cards, members,
    h("div", { class: "two" }, models, tenants), chart, pending);
  const drawHistory = mountHistory(chart, ctx.me);

  return async () => {
    // both asked at once; the totals are drawn as soon as /pool answers, the pending table after
    const waiting = get("workloads", { status: "pending", limit: 25 });
    waiting.catch(() => {}); // its failure is reported by the await below, not as an unhandled rejection
    const who = ctx.me.admin ? "admin" : "tenant:" + ctx.me.tenant;
    const since = monthStartS(Date.now());
    let costing = null;
    if (cost.who !== who || cost.since !== since || Date.now() - cost.at >= COST_EVERY_MS) {
      const same = cost.who === who && cost.since === since;
      cost = { at: Date.now(), who, since, usage: same ? cost.usage : null }; // a failed ask waits its turn too
      costing = get("usage", { by: "tenant", since_s: since });
      costing.catch(() => {});
    }
    const servers = ctx.me.admin ? get("servers") : null; // admin only: it names the servers' addresses
    if (servers) servers.catch(() => {});
    const pool = await get("pool");
    drawCards(cards, pool);
    if (pool.federation) { // a hub: each member's capacity, queue and price now
      members.hidden = false;
      update(members, await get("federation/members"), drawMembers);
    }
    if (servers) drawLeader(leader, await servers);
    cards.appendChild(costCard);
    if (!costing) drawCost(costCard, cost.usage, ctx.me.admin);
    update(models, pool.by_model, () => [h("h2", { id: "h-models" }, "Devices allocated by model"), table("Allocated device share by device model",
      ["Model", "Devices", "Allocated", "Utilisation"],
      pool.by_model.map((m) => [
        h("span", {}, m.model, m.simulated ? h("span", { class: "sim", title: "simulated devices" }, " (simulated)") : ""),
        String(m.devices), gpus(m.allocated_gpus),
        h("span", { class: "meter" }, bar(`${Math.round(m.utilisation * 100)} % of ${m.model} allocated`,
          [[m.utilisation, "used"]]), ` ${Math.round(m.utilisation * 100)} %`),
      ]), "no devices")]);
    const seen = ctx.me.admin ? "Devices allocated by tenant" : "Your tenant's devices";
    update(tenants, pool.by_tenant, () => [h("h2", { id: "h-tenants" }, seen), table("Allocated devices and workloads by tenant",
      ["Tenant", "Allocated", "Running", "Pending"],
      pool.by_tenant.map((t) => [
        h("span", {}, h("span", { class: "swatch " + tenantClass(t.tenant), "aria-hidden": "true" }), t.tenant),
        gpus(t.allocated_gpus), String(t.running), String(t.pending),
      ]), "no workloads yet")]);
    await drawHistory();
    update(pending, await waiting, drawPending);
    if (costing) { // last, so a slow metering query holds back nothing else
      cost.usage = await costing;
      drawCost(costCard, cost.usage, ctx.me.admin);
    }
  };
}

/** Which server leads the pool, under which epoch, and how long ago it renewed its lease. */
export function leaderText(answer) {
  if (!answer.ha) return "Single server (no --ha): it schedules the pool itself.";
  const others = answer.servers.length - 1;
  const peers = others > 0 ? `; ${others} other server${others > 1 ? "s" : ""} follow` : "";
  const lead = answer.servers.find((s) => s.leader);
  if (!lead) return `No server leads right now (last epoch ${answer.epoch ?? "-"}): another takes over within the lease${peers}.`;
  return `Leader: ${lead.id} (${lead.address}), epoch ${lead.epoch}, lease renewed ${lead.lease_age_s.toFixed(1)} s ago${peers}.`;
}

function drawLeader(el, answer) {
  el.hidden = false;
  el.textContent = leaderText(answer);
}

function drawCost(el, usage, admin) {
  if (!usage) return;
  el.hidden = false;
  const label = `cost so far this month (${usage.currency}, ${admin ? "all tenants" : "your tenant"}` +
    `${usage.total.priced ? "" : "; some models unpriced"})`;
  const cost = money(usage.total.cost, usage.currency);
  update(el, [cost, label], () => [h("div", { class: "value", id: "c-cost" }, cost),
    h("div", { class: "label" }, label)]);
}

function drawCards(cards, pool) {
  const card = (label, value, id) => h("div", { class: "card" }, h("div", { class: "value", id }, value), h("div", { class: "label" }, label));
  const w = pool.workloads;
  replace(cards,
    card(pool.simulated ? "nodes (simulated)" : "nodes", String(pool.nodes), "c-nodes"),
    card("devices", String(pool.devices), "c-devices"),
    card("devices allocated", `${gpus(pool.allocated_gpus)} (${Math.round(pool.utilisation * 100)} %)`, "c-allocated"),
    card("running", String((w.running || 0) + (w.admitted || 0)), "c-running"),
    card("pending", String(w.pending || 0), "c-pending"),
    card("succeeded", String(w.succeeded || 0), "c-succeeded"),
    card("failed", String(w.failed || 0), "c-failed"));
}

/** One row per member of a federation: its devices free of all, its queue and its price now. */
export function memberCells(m) {
  const free = Math.max(0, m.capacity_gpus - m.allocated_gpus);
  return [m.name, m.region, m.note ? `${m.state} (${m.note})` : m.state,
    `${gpus(free)} of ${gpus(m.capacity_gpus)}`, String(m.pending), String(m.running),
    `${m.price_gpu_hour.toFixed(2)} ${m.currency}`];
}

function drawMembers(list) {
  return [h("h2", { id: "h-members" }, "Members"), table("Member pools of this federation: capacity, queue and price now",
    ["Member", "Region", "State", "Devices free", "Pending", "Running", "Price per GPU-hour"],
    list.map((m) => ({ attrs: { "data-member": m.name, class: m.state === "up" ? "" : "down" }, cells: memberCells(m) })),
    "no members")];
}

function drawPending(page) {
  const reasons = new Map();
  for (const w of page.items) {
    const key = w.reason_text || w.reason || "waiting";
    reasons.set(key, (reasons.get(key) || 0) + 1);
  }
  const shown = page.total > page.items.length ? ` (the newest ${page.items.length} of ${page.total})` : "";
  return [h("h2", { id: "h-pending" }, `Pending work: ${page.total}`),
    page.items.length ? h("ul", { class: "reasons", "aria-label": "Why work waits" },
      [...reasons.entries()].sort((a, b) => b[1] - a[1]).map(([text, n]) => h("li", {}, `${n} × ${text}`))) : "",
    table("Pending workloads" + shown,
      ["Workload", "Tenant", "Queue", "Submitted", "Why it waits"],
      page.items.map((w) => [
        link("workloads/" + w.id, w.name ? `${w.name} (${w.id})` : w.id), w.tenant, w.queue, when(w.submit_s),
        h("span", { title: w.reason_hint || "" }, w.reason_text || w.reason || ""),
      ]), "nothing waits")];
}
