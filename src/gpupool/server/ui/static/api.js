// The one way the dashboard talks to the server: /api/v1 with the token from this tab's
// sessionStorage as a bearer header. The token never goes into a URL.

const KEY = "gpupool.token";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export const session = {
  token() { return sessionStorage.getItem(KEY) || ""; },
  set(token) { sessionStorage.setItem(KEY, token); kept.clear(); },
  clear() { sessionStorage.removeItem(KEY); kept.clear(); },
};

/** GET /api/v1/<path> with query `params` (arrays repeat the key); the parsed JSON, or ApiError. */
export async function get(path, params) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params || {})) {
    if (value === null || value === undefined || value === "") continue;
    for (const one of Array.isArray(value) ? value : [value]) query.append(key, String(one));
  }
  const url = "/api/v1/" + path + (query.toString() ? "?" + query : "");
  let answer;
  try {
    answer = await fetch(url, { headers: { Authorization: "Bearer " + session.token() }, cache: "no-store" });
  } catch (err) {
    throw new ApiError(0, "The server does not answer; retrying.");
  }
  if (!answer.ok) {
    let message = "The server answered " + answer.status + ".";
    try { message = (await answer.json()).message || message; } catch (err) { /* not JSON */ }
    throw new ApiError(answer.status, message);
  }
  return answer.json();
}

const kept = new Map(); // path -> { etag, data }: the last answer of each route read with getKept

/** GET /api/v1/<path> sending the ETag of this route's last answer: when the server says it has not
 *  changed (304), the very same parsed object comes back, so a view can skip redrawing it. */
export async function getKept(path) {
  const last = kept.get(path);
  const headers = { Authorization: "Bearer " + session.token() };
  if (last) headers["If-None-Match"] = last.etag;
  let answer;
  try {
    answer = await fetch("/api/v1/" + path, { headers, cache: "no-store" });
  } catch (err) {
    throw new ApiError(0, "The server does not answer; retrying.");
  }
  if (answer.status === 304 && last) {
    // Read the (empty) body all the same: Chromium finishes a request only once its body is read,
    // and cancels an unread one (net::ERR_ABORTED) when it collects the dropped answer.
    await answer.arrayBuffer();
    return last.data;
  }
  if (!answer.ok) {
    let message = "The server answered " + answer.status + ".";
    try { message = (await answer.json()).message || message; } catch (err) { /* not JSON */ }
    throw new ApiError(answer.status, message);
  }
  const data = await answer.json();
  const etag = answer.headers.get("ETag");
  if (etag) kept.set(path, { etag, data });
  else kept.delete(path);
  return data;
}

/** POST /api/v1/<path> with query `params` and no body (the admin actions); the parsed JSON, or ApiError. */
export async function post(path, params) {
  const query = new URLSearchParams(Object.entries(params || {}).filter(([, v]) => v !== null && v !== undefined));
  const url = "/api/v1/" + path + (query.toString() ? "?" + query : "");
  let answer;
  try {
    answer = await fetch(url, { method: "POST", headers: { Authorization: "Bearer " + session.token() }, cache: "no-store" });
  } catch (err) {
    throw new ApiError(0, "The server does not answer; try again.");
  }
  if (!answer.ok) {
    let message = "The server answered " + answer.status + ".";
    try { message = (await answer.json()).message || message; } catch (err) { /* not JSON */ }
    throw new ApiError(answer.status, message);
  }
  kept.clear(); // what the action changed is read afresh
  return answer.json();
}
