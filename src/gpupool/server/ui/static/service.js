// One service: its state and replicas (node, endpoint, readiness), charts of its replicas, requests/s
// and latency over the last hour, day or week (the store's history, one point a minute), the router's
// numbers now, and its scale events with their reasons. Latency is p50/p99 per request; where only
// HAProxy's `show stat` mean is known the page says so rather than show a mean as a p50.

import { get } from "./api.js";
import { h, link, statusBadge, table, update, when } from "./dom.js";
import { lineChart } from "./chart.js";

const RANGES = ["1h", "24h", "7d"];
const HISTORY_EVERY_MS = 30000; // one point a minute in the store

export function title(name) { return "Service " + name; }

export function mount(root, ctx) {
  const name = ctx.arg;
  const tenant = new URLSearchParams(location.search).get("tenant") || undefined;
  const who = tenant ? { tenant } : {};
  let chosen = "1h";
  let last = 0;
  const head = h("div");
  const replicas = h("section", { "aria-labelledby": "h-replicas" });
  const buttons = RANGES.map((r) => h("button", { type: "button", "data-range": r, "aria-pressed": r === chosen ? "true" : "false",
    onclick: () => { chosen = r; last = 0; for (const b of buttons) b.setAttribute("aria-pressed", b.dataset.range === r ? "true" : "false"); } }, r));
  const charts = h("div", { id: "service-charts" });
  const events = h("section", { "aria-labelledby": "h-scale-events" });
  root.append(h("p", {}, link("services", "← All services")), head, replicas,
    h("section", { "aria-labelledby": "h-service-history" },
      h("h2", { id: "h-service-history" }, "History", h("span", { class: "ranges", role: "group", "aria-label": "Range" }, buttons)),
      charts),
    events);

  return async () => {
    const path = "services/" + encodeURIComponent(name);
    const s = await get(path, who);
    update(head, [s.state, s.ready_replicas, s.desired, s.last_probe_error, s.live], () => summary(s));
    update(replicas, s.replicas, () => [h("h2", { id: "h-replicas" }, "Replicas"), table("Its replicas: where they run and whether they serve",
      ["Replica", "Status", "Ready", "Node", "Endpoint", "Last error"],
      s.replicas.map((r) => ({ attrs: { "data-replica": r.workload_id }, cells: [
        link("workloads/" + encodeURIComponent(r.workload_id), r.workload_id), statusBadge(r.status), r.ready,
        r.node, r.host ? `${r.host}:${r.port}` : "", r.last_error] })), "no replicas")]);
    if (Date.now() - last < HISTORY_EVERY_MS) return;
    last = Date.now();
    const past = await get(path + "/history", { ...who, range: chosen });
    update(charts, [past.series, past.range], () => drawCharts(past));
    update(events, past.events, () => [h("h2", { id: "h-scale-events" }, "Scale events"),
      table(`Its events over the last ${past.range}, oldest first`, ["When", "Reason", "Message"],
        past.events.map((e) => [when(e.at_s), e.reason, e.message]), "no events in this range")]);
  };
}

function summary(s) {
  const row = (term, value) => [h("dt", {}, term), h("dd", {}, value)];
  const live = s.live;
  let latency = "no router serves this pool (--serve-port)";
  if (live && live.latency_p50_ms !== null) latency = `p50 ${live.latency_p50_ms.toFixed(2)} ms, p99 ${(live.latency_p99_ms ?? 0).toFixed(2)} ms`;
  else if (live && live.latency_mean_ms !== null) latency = `mean ${live.latency_mean_ms.toFixed(2)} ms (HAProxy's show stat: its last 1024 requests; no quantiles yet)`;
  else if (live) latency = "no requests yet";
  return [
    h("h1", {}, s.name, " ", statusBadge(s.state)),
    h("dl", { class: "facts" },
      row("Tenant", s.tenant),
      row("Address", h("span", { id: "svc-url" }, s.url || "none: this pool routes no service traffic (gpupool up --serve-port)")),
      row("Replicas ready / desired", h("span", { id: "svc-replicas" }, `${s.ready_replicas} / ${s.desired} (min ${s.min_replicas}, max ${s.max_replicas})`)),
      row("Requests/s now", h("span", { id: "svc-rps" }, live ? live.requests_per_s.toFixed(1) : "no router")),
      row("In flight now", live ? String(live.in_flight) : ""),
      row("Latency", h("span", { id: "svc-latency" }, latency)),
      s.last_probe_error ? row("Probe error", s.last_probe_error) : "",
      row("Public", s.public ? "yes: anyone may call it" : "no: its tenant's tokens only")),
  ];
}

function drawCharts(past) {
  const find = (n) => (past.series.find((s) => s.name === n) || { values: [] }).values;
  const chart = (series, label, id, unit) => {
    const shown = series.filter((s) => s.values.length);
    if (!shown.length) return h("p", { class: "summary", id }, `${label}: no history yet (sampled once a minute).`);
    const top = Math.max(1, ...shown.flatMap((s) => s.values.map((v) => v[1])));
    const figure = lineChart(shown, top, `${label} over the last ${past.range}`, unit);
    figure.id = id;
    return [h("h3", {}, label), figure];
  };
  const latency = past.latency === "mean"
    ? [{ name: "mean latency (HAProxy: no quantiles)", cls: "t1", values: find("latency_mean_ms") }]
    : [{ name: "p50", cls: "t2", values: find("latency_p50_ms") }, { name: "p99", cls: "t1", values: find("latency_p99_ms") },
      { name: "mean (HAProxy)", cls: "t3", values: find("latency_mean_ms") }];
  return [
    chart([{ name: "desired", cls: "total", values: find("desired") }, { name: "ready", cls: "t2", values: find("ready") }],
      "Replicas", "service-replicas-chart", "replicas"),
    chart([{ name: "requests/s", cls: "t0", values: find("requests_per_s") }, { name: "in flight", cls: "t1", values: find("in_flight") }],
      "Traffic", "service-traffic-chart", ""),
    chart(latency, "Latency (ms)", "service-latency-chart", "ms"),
  ];
}
