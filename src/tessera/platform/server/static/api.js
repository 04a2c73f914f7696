// The console's only way to the server: JSON calls and streamed logs, each with the API key in the
// Authorization header. The key lives in sessionStorage (this tab only), never in a URL the server logs.

const KEY = "tessera.apiKey";
const BASE = "/api/v1";

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function apiKey() {
  return sessionStorage.getItem(KEY);
}

export function setApiKey(key) {
  sessionStorage.setItem(KEY, key);
}

export function forgetApiKey() {
  sessionStorage.removeItem(KEY);
}

function headers(extra = {}) {
  return { Authorization: `Bearer ${apiKey() || ""}`, ...extra };
}

// The server answers errors as {"detail": "..."} (FastAPI); a 422 from validation carries a list.
async function errorFrom(response) {
  let detail = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (typeof body.detail === "string") detail = body.detail;
    else if (Array.isArray(body.detail)) detail = body.detail.map((d) => d.msg || JSON.stringify(d)).join("; ");
  } catch {
    // not JSON: keep the status line
  }
  return new ApiError(response.status, detail);
}

// Listeners told when the key is refused, so the app can return to the login form.
const unauthorizedListeners = [];
export function onUnauthorized(listener) {
  unauthorizedListeners.push(listener);
}

async function checked(response) {
  if (response.ok) return response;
  const error = await errorFrom(response);
  if (response.status === 401) unauthorizedListeners.forEach((listener) => listener(error));
  throw error;
}

export function query(params) {
  const pairs = Object.entries(params).filter(([, v]) => v !== undefined && v !== null && v !== "");
  return pairs.length ? `?${new URLSearchParams(pairs)}` : "";
}

export async function api(path, { method = "GET", body, signal } = {}) {
  const init = { method, signal, headers: headers() };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers = headers({ "Content-Type": "application/json" });
  }
  const response = await checked(await fetch(BASE + path, init));
  if (response.status === 204) return null;
  return response.json();
}

export const runPath = (name) => `/runs/${encodeURIComponent(name)}`;

// Server-sent events over fetch(): EventSource cannot send an Authorization header. Calls
// onEvent(type, data) for each event ("message" unless the server named it) until the stream ends or
// `signal` aborts; resolves to true when the server sent `event: end`.
export async function streamEvents(path, { signal, onEvent }) {
  const response = await checked(await fetch(BASE + path, { headers: headers(), signal }));
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let ended = false;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    const blocks = buffer.split(/\r?\n\r?\n/);
    buffer = blocks.pop();
    for (const block of blocks) {
      const event = parseEvent(block);
      if (!event) continue;
      if (event.type === "end") ended = true;
      onEvent(event.type, event.data);
    }
  }
  return ended;
}

function parseEvent(block) {
  let type = "message";
  const data = [];
  for (const line of block.split(/\r?\n/)) {
    if (line === "" || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") type = value;
    else if (field === "data") data.push(value);
  }
  if (type === "message" && data.length === 0) return null;
  return { type, data: data.join("\n") };
}
