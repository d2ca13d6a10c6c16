// Nodes: every device drawn as its slices (compute and memory), coloured by tenant; health,
// state and the simulated marker. A tenant sees its own slices by tenant and the rest as "others".
// Each device's `held` slices come with GET /nodes (a tenant's token gets only its own there), so
// no workload listing is read; an unchanged listing (304 on its ETag) is not drawn again.

import { getKept, post } from "./api.js";
import { actionButton, bar, h, mib, replace, tenantClass, update } from "./dom.js";

const PAGE_NODES = 100;

export function title() { return "Nodes"; }

export function mount(root, ctx) {
  const state = { filter: "", onlyUnhealthy: false, shown: PAGE_NODES };
  const summary = h("p", { class: "summary", "aria-live": "polite" });
  const legend = h("div", { class: "legend-wrap" });
  const list = h("div", { class: "nodes" });
  const more = h("button", { type: "button", hidden: true, onclick: () => { state.shown += PAGE_NODES; rerun(); } }, "Show more nodes");
  const filter = h("input", { id: "node-filter", type: "search", autocomplete: "off",
    oninput: () => { state.filter = filter.value.trim(); state.shown = PAGE_NODES; rerun(); } });
  const unhealthy = h("input", { id: "node-unhealthy", type: "checkbox",
    onchange: () => { state.onlyUnhealthy = unhealthy.checked; state.shown = PAGE_NODES; rerun(); } });
  root.append(h("h1", {}, "Nodes"),
    h("div", { class: "filters" },
      h("label", { for: "node-filter" }, "Node name contains"), filter,
      h("label", { class: "check" }, unhealthy, " only nodes that are not ready")),
    summary, legend, list, more);
  let last = null;
  const rerun = () => { if (last) draw(last); };

  function draw(nodes) {
    last = nodes;
    const chosen = nodes.filter((n) => n.name.includes(state.filter) && (!state.onlyUnhealthy || n.state !== "ready"));
    const shown = chosen.slice(0, state.shown);
    const devices = nodes.reduce((sum, n) => sum + n.devices.length, 0);
    const down = nodes.filter((n) => !n.healthy).length;
    summary.textContent = `${nodes.length} nodes, ${devices} devices, ${down} unhealthy; showing ${shown.length} of ${chosen.length}.`;
    const tenants = [...new Set(nodes.flatMap((n) => n.devices.flatMap((d) => d.held.map((s) => s.tenant))))].sort();
    update(legend, tenants, () => h("ul", { class: "legend", "aria-label": "Colours" },
      tenants.map((t) => h("li", {}, h("span", { class: "swatch " + tenantClass(t), "aria-hidden": "true" }), t)),
      ctx.me.admin ? "" : h("li", {}, h("span", { class: "swatch others", "aria-hidden": "true" }), "other tenants"),
      h("li", {}, h("span", { class: "swatch free", "aria-hidden": "true" }), "free")));
    // keep one card per node; rebuild a card only when what it shows changed
    const cards = new Map([...list.children].map((c) => [c.dataset.node, c]));
    const wanted = [];
    for (const node of shown) {
      const mine = node.devices.map((d) => d.held);
      let card = cards.get(node.name);
      if (!card) { card = h("article", { class: "node", "data-node": node.name }); }
      if (update(card, [node, mine], () => nodeCard(node, mine, ctx.me.admin))) card.classList.toggle("down", !node.healthy);
      wanted.push(card);
    }
    if (wanted.length !== list.children.length || wanted.some((c, i) => list.children[i] !== c)) replace(list, wanted);
    more.hidden = chosen.length <= shown.length;
  }

  return async () => {
    const nodes = await getKept("nodes");
    if (nodes !== last) draw(nodes);
  };
}

function nodeCard(node, holders, admin) {
  const badges = [h("span", { class: "badge state-" + node.state }, node.state)];
  if (node.simulated) badges.push(h("span", { class: "badge sim" }, "simulated"));
  if (node.injected_fault) badges.push(h("span", { class: "badge state-unhealthy" }, "fault injected"));
  return [
    h("h2", {}, node.name, " ", badges),
    admin ? nodeActions(node) : "",
    h("p", { class: "hostline" }, `cpu ${(node.allocated_cpu_milli / 1000).toFixed(1)} of ${(node.cpu_milli / 1000).toFixed(0)} cores · `
      + `memory ${mib(node.allocated_memory_mib)} of ${mib(node.memory_mib)}`),
    h("ul", { class: "devices", "aria-label": `Devices of ${node.name}` },
      node.devices.map((d, i) => device(node, d, holders[i], admin))),
  ];
}

/** The admin's actions on a node, each behind a confirmation (a tenant's page shows none, and the
 * server refuses them to a tenant's token). */
function nodeActions(node) {
  const name = encodeURIComponent(node.name);
  const buttons = [];
  if (!node.draining) {
    buttons.push(actionButton("Drain", `Drain ${node.name}? No new work is placed there; the work running there finishes.`,
      () => post(`nodes/${name}/drain`)));
  }
  if (node.cordoned || node.draining) {
    buttons.push(actionButton("Uncordon", `Uncordon ${node.name} so new work is placed there again?`,
      () => post(`nodes/${name}/uncordon`)));
  }
  if (node.injected_fault || node.unhealthy_devices.length) {
    buttons.push(actionButton("Heal", `Heal ${node.name}: clear every fault injected into it and its devices?`,
      () => post(`nodes/${name}/heal`)));
  }
  return h("p", { class: "actions", "aria-label": `Actions on ${node.name}` }, buttons);
}

function device(node, d, slices, admin) {
  const computeParts = [];
  const memoryParts = [];
  let ownCompute = 0;
  let ownMemory = 0;
  for (const s of slices) {
    const who = `${s.name || s.workload} (${s.tenant})`;
    computeParts.push([s.compute_milli / 1000, tenantClass(s.tenant), `${who}: ${s.compute_milli} milli`]);
    memoryParts.push([s.memory_mib / d.memory_mib, tenantClass(s.tenant), `${who}: ${mib(s.memory_mib)}`]);
    ownCompute += s.compute_milli;
    ownMemory += s.memory_mib;
  }
  if (!admin && d.allocated_milli > ownCompute) {
    computeParts.push([(d.allocated_milli - ownCompute) / 1000, "others", "other tenants"]);
  }
  if (!admin && d.allocated_memory_mib > ownMemory) {
    memoryParts.push([(d.allocated_memory_mib - ownMemory) / d.memory_mib, "others", "other tenants"]);
  }
  const label = `Device ${d.index} ${d.model}`;
  const health = d.healthy ? "" : h("span", { class: "badge state-unhealthy" }, "unhealthy");
  return h("li", { class: "device" + (d.healthy ? "" : " down"), "data-device": `${node.name}/${d.index}` },
    h("div", { class: "devhead" }, `${d.index} · ${d.model}`, d.simulated ? h("span", { class: "sim" }, " sim") : "", " ", health),
    bar(`${label} compute: ${d.allocated_milli} of 1000 milli allocated`, computeParts),
    bar(`${label} memory: ${mib(d.allocated_memory_mib)} of ${mib(d.memory_mib)} allocated`, memoryParts),
    h("div", { class: "devfoot" }, `${d.allocated_milli}m · ${mib(d.allocated_memory_mib)}/${mib(d.memory_mib)}`));
}
