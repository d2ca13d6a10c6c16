// One workload: its state and why, its pods and where they run (placement), its events and the
// tail of its log, followed as it grows.

import { get, post } from "./api.js";
import { actionButton, h, link, mib, replace, statusBadge, table, update, when } from "./dom.js";

const TAIL_CHARS = 64 * 1024;

export function title(id) { return "Workload " + id; }

export function mount(root, ctx) {
  const id = ctx.arg;
  const head = h("div");
  const pods = h("section", { "aria-labelledby": "h-pods" });
  const events = h("section", { "aria-labelledby": "h-events" });
  const rankPick = h("select", { id: "log-rank" });
  const log = h("pre", { class: "log", id: "log", tabindex: "0", "aria-label": "Log tail" });
  const logNote = h("p", { class: "summary" });
  root.append(h("p", {}, link("workloads", "← All workloads")), head, pods, events,
    h("section", { "aria-labelledby": "h-log" }, h("h2", { id: "h-log" }, "Log"),
      h("label", { for: "log-rank" }, "Replica "), rankPick, logNote, log));
  const tail = { rank: 0, offset: 0, text: "", complete: false };
  rankPick.addEventListener("change", () => {
    Object.assign(tail, { rank: Number(rankPick.value), offset: 0, text: "", complete: false });
    log.textContent = "";
  });

  return async () => {
    const [w, evs] = await Promise.all([get("workloads/" + encodeURIComponent(id)),
      get(`workloads/${encodeURIComponent(id)}/events`)]);
    update(head, w, () => summary(w, ctx.me));
    update(pods, w.pods, () => [h("h2", { id: "h-pods" }, "Pods and placement"), table("Pods of this workload",
      ["Rank", "Pod", "Status", "Node", "Device slices", "Host cpu / memory", "Exit", "Message"],
      w.pods.map((p) => [String(p.rank), p.name || p.id, statusBadge(p.status),
        h("span", {}, p.node, p.simulated ? h("span", { class: "sim" }, " (simulated)") : ""),
        p.slices.map((s) => `device ${s.device_index}: ${s.compute_milli}m, ${mib(s.memory_mib)}`).join("; "),
        `${(p.cpu_milli / 1000).toFixed(2)} / ${mib(p.memory_mib)}`,
        p.exit_code === null ? "" : String(p.exit_code), p.message]), "not placed yet")]);
    update(events, evs, () => [h("h2", { id: "h-events" }, "Events"), table("What happened to it, oldest first",
      ["When", "Change", "Reason", "Message"],
      evs.map((e) => [when(e.at_s), `${e.from_status || "·"} → ${e.to_status}`,
        h("span", { title: e.reason }, e.reason_text || e.reason), e.message]), "no events")]);
    const replicas = w.spec.replicas || 1;
    if (rankPick.options.length !== replicas) {
      replace(rankPick, Array.from({ length: replicas }, (_, i) => h("option", { value: i }, String(i))));
      rankPick.value = String(tail.rank);
    }
    await followLog(w);
  };

  async function followLog(w) {
    if (tail.complete) return;
    for (let chunks = 0; chunks < 8; chunks++) {
      const part = await get(`workloads/${encodeURIComponent(id)}/logs`, { rank: tail.rank, offset: tail.offset });
      tail.complete = part.complete;
      const grew = part.offset !== tail.offset;
      tail.offset = part.offset;
      if (part.text) {
        tail.text = (tail.text + part.text).slice(-TAIL_CHARS);
        const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
        log.textContent = tail.text;
        if (atBottom) log.scrollTop = log.scrollHeight;
      }
      if (!grew || part.complete) break;
    }
    logNote.textContent = tail.complete ? "The log is complete." : (w.status === "pending" ? "No output yet: it has not started." : "Following the log as it grows.");
  }
}

/** The actions its state allows, each behind a confirmation (the page shows a tenant only its own
 * work, so a tenant's token gets the actions on its own work only; the server checks every call). */
export function actions(w, me) {
  const id = encodeURIComponent(w.id);
  const who = w.name ? `${w.name} (${w.id})` : w.id;
  const buttons = [];
  if (w.status === "pending" && !w.held) {
    buttons.push(actionButton("Hold", `Hold ${who} so it is not placed until released?`, () => post(`workloads/${id}/hold`)));
  }
  if (w.status === "pending" && w.held && (me.admin || w.held !== "admin")) {
    buttons.push(actionButton("Release", `Release ${who} so it can be placed?`, () => post(`workloads/${id}/release`)));
  }
  if (w.status === "admitted" || w.status === "running") {
    buttons.push(actionButton("Requeue", `Stop ${who}'s pods and send it back to pending?`, () => post(`workloads/${id}/requeue`)));
  }
  if (!["succeeded", "failed", "cancelled"].includes(w.status)) {
    buttons.push(actionButton("Cancel", `Cancel ${who}? Its pods are stopped and it will not run again.`, () => post(`workloads/${id}/cancel`)));
  }
  return buttons.length ? h("p", { class: "actions", "aria-label": "Actions" }, buttons) : "";
}

function summary(w, me) {
  const row = (term, value) => [h("dt", {}, term), h("dd", {}, value)];
  return [
    h("h1", {}, w.name ? `${w.name} ` : "", h("span", { class: "id" }, w.id), " ", statusBadge(w.status),
      w.held ? h("span", { class: "badge", id: "wl-held" }, `held by the ${w.held}`) : ""),
    actions(w, me),
    h("dl", { class: "facts" },
      row("Why", h("span", { id: "wl-reason" }, w.reason_text || w.reason || "")),
      w.reason_hint ? row("What to do", w.reason_hint) : "",
      w.message ? row("Message", w.message) : "",
      row("Tenant / queue", `${w.tenant} / ${w.queue}`),
      row("Priority", `${w.priority}${w.spec.priority_class ? " (" + w.spec.priority_class + ")" : ""}`),
      row("Command", h("code", {}, w.spec.command.join(" "))),
      row("Replicas", String(w.spec.replicas)),
      row("Devices per replica", String(w.spec.resources.gpus || 0) + (w.spec.resources.gpu_memory ? `, ${w.spec.resources.gpu_memory}` : "")),
      row("Submitted", when(w.submit_s)),
      w.started_s ? row("Started", when(w.started_s)) : "",
      w.finished_s ? row("Finished", when(w.finished_s) + (w.exit_code === null ? "" : ` (exit ${w.exit_code})`)) : "",
      w.attempt > 1 ? row("Attempts", String(w.attempt)) : "",
      w.simulated ? row("Devices", "simulated") : ""),
  ];
}
