// The dashboard's shell: log in, route /ui/<page> to its view without reloads, and poll the view.

import { ApiError, get, session } from "./api.js";
import { replace } from "./dom.js";
import * as overview from "./overview.js";
import * as nodes from "./nodes.js";
import * as workloads from "./workloads.js";
import * as workload from "./workload.js";
import * as queues from "./queues.js";
import * as usage from "./usage.js";
import * as fabric from "./fabric.js";
import * as services from "./services.js";
import * as service from "./service.js";

const POLL_MS = 1000;
const $ = (id) => document.getElementById(id);
let me = null;           // GET /whoami: { admin, tenant, token_id }
let generation = 0;      // bumped on every navigation: a stale view's poll stops
let refresh = null;

function route(path) {
  const rest = path.split("?")[0].replace(/^\/ui\/?/, "").replace(/\/+$/, "");
  const [first, second] = rest.split("/");
  if (first === "nodes") return { page: "nodes", view: nodes };
  if (first === "workloads" && second) return { page: "workloads", view: workload, arg: decodeURIComponent(second) };
  if (first === "workloads") return { page: "workloads", view: workloads };
  if (first === "queues") return { page: "queues", view: queues };
  if (first === "usage") return { page: "usage", view: usage };
  if (first === "fabric") return { page: "fabric", view: fabric };
  if (first === "services" && second) return { page: "services", view: service, arg: decodeURIComponent(second) };
  if (first === "services") return { page: "services", view: services };
  return { page: "overview", view: overview };
}

function showBanner(text) {
  const banner = $("banner");
  banner.hidden = !text;
  banner.textContent = text || "";
}

async function poll(mine) {
  if (mine !== generation || !refresh) return;
  try {
    await refresh();
    if (mine !== generation) return;
    showBanner("");
    $("updated").textContent = "Updated " + new Date().toLocaleTimeString();
  } catch (err) {
    if (mine !== generation) return;
    if (err instanceof ApiError && err.status === 401) { logout("Your token was refused: " + err.message); return; }
    showBanner(err instanceof ApiError ? err.message : "The page failed to draw: " + err);
  }
  if (mine === generation) setTimeout(() => poll(mine), POLL_MS);
}

function show(path) {
  const { page, view, arg } = route(path);
  generation += 1;
  for (const a of document.querySelectorAll("#nav a")) {
    if (a.dataset.page === page) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  const said = $("action-result"); // what the last action did, said on the page it was taken from
  if (said) said.textContent = "";
  const root = replace($("view"));
  document.title = view.title(arg) + " · gpupool";
  refresh = view.mount(root, { me, arg });
  poll(generation);
}

function navigate(path) {
  if (path !== location.pathname) history.pushState(null, "", path);
  show(path);
  $("main").focus();
}

function loggedIn(who, pool) {
  me = { ...who, fabric: Boolean(pool && pool.fabric) };
  $("login").hidden = true;
  // the Fabric tab only where the pool knows a fabric: a pool without one has nothing to show there
  document.querySelector("#nav a[data-page=fabric]").hidden = !me.fabric;
  $("nav").hidden = false;
  $("logout").hidden = false;
  $("who").textContent = who.admin ? "admin" : "tenant " + who.tenant;
  show(location.pathname);
}

function logout(message) {
  session.clear();
  me = null;
  generation += 1;
  refresh = null;
  replace($("view"));
  $("nav").hidden = true;
  $("logout").hidden = true;
  $("who").textContent = "";
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  showBanner("");
  $("token").focus();
}

async function login(token) {
  session.set(token);
  try {
    const who = await get("whoami");
    loggedIn(who, await get("pool"));
  } catch (err) {
    logout(err instanceof ApiError && err.status ? err.message : "The server does not answer; try again.");
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = $("token").value.trim();
    $("token").value = "";
    login(token);
  });
  $("logout").addEventListener("click", () => logout(""));
  document.addEventListener("click", (event) => {
    const a = event.target.closest("a");
    if (!a || event.defaultPrevented || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey) return;
    const url = new URL(a.href, location.href);
    if (url.origin !== location.origin || !url.pathname.startsWith("/ui/") || url.pathname.startsWith("/ui/assets/")) return;
    event.preventDefault();
    navigate(url.pathname + url.search);
  });
  window.addEventListener("popstate", () => { if (me) show(location.pathname); });
  if (session.token()) login(session.token());
  else logout("");
});

export { navigate };
