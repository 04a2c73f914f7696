// The console's only way to the server: one function per API call (JSON, or a run's streamed logs), each
// with the API key in the Authorization header. The key lives in sessionStorage (this tab only), never in
// a URL the server logs.

const KEY = "tessera.apiKey";
const BASE = "/api/v1";

class ApiError extends Error {
  constructor(status, message, code) {
    super(message);
    this.status = status;
    this.code = code;   // the problem's stable code (run_exists, run_not_found, ...)
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

// The server answers errors as application/problem+json: {"type", "title", "status", "detail", "code"}.
async function errorFrom(response) {
  let detail = `${response.status} ${response.statusText}`;
  let code = null;
  try {
    const body = await response.json();
    if (typeof body.detail === "string") detail = body.detail;
    if (typeof body.code === "string") code = body.code;
  } catch {
    // not JSON: keep the status line
  }
  return new ApiError(response.status, detail, code);
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

function query(params) {
  const pairs = Object.entries(params).filter(([, v]) => v !== undefined && v !== null && v !== "");
  return pairs.length ? `?${new URLSearchParams(pairs)}` : "";
}

// One request: `template` is the API's path as the OpenAPI document names it ("/runs/{name}/stop"), its
// {names} filled in from `names`, encoded. Every call the console makes is one of the functions below,
// so tests/server/test_api_contract.py reads them here and checks each against the server's routes.
function url(template, names, params) {
  return BASE + template.replace(/\{(\w+)\}/g, (_, key) => encodeURIComponent(names[key])) + query(params);
}

async function call(method, template, { names = {}, params = {}, body } = {}) {
  const init = { method, headers: headers() };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers = headers({ "Content-Type": "application/json" });
  }
  const response = await checked(await fetch(url(template, names, params), init));
  if (response.status === 204) return null;
  return response.json();
}

export const whoami = () => call("GET", "/whoami");
export const listRuns = (params) => call("GET", "/runs", { params });
export const getRun = (name) => call("GET", "/runs/{name}", { names: { name } });
export const stopRun = (name) => call("POST", "/runs/{name}/stop", { names: { name } });
export const restartRun = (name) => call("POST", "/runs/{name}/restart", { names: { name }, body: {} });
export const moveRun = (name, cluster) =>
  call("POST", "/runs/{name}/move", { names: { name }, body: { cluster } });
export const cloneRun = (name, newName) =>
  call("POST", "/runs/{name}/clone", { names: { name }, body: { name: newName } });
export const runMetrics = (name, after) => call("GET", "/runs/{name}/metrics", { names: { name }, params: { after } });
export const runEvents = (name, cursor) => call("GET", "/runs/{name}/events", { names: { name }, params: { cursor } });
export const listClusters = () => call("GET", "/clusters");
export const describeCluster = (name) => call("GET", "/clusters/{name}", { names: { name } });

// A run's logs, followed: server-sent events over fetch() (EventSource cannot send an Authorization
// header). Calls onEvent(type, data) for each event ("message" unless the server named it) until the
// stream ends or `signal` aborts; resolves to true when the server sent `event: end`.
export function followLogs(name, params, { signal, onEvent }) {
  return streamEvents("GET", "/runs/{name}/logs", { names: { name }, params: { ...params, follow: 1 }, signal,
    onEvent });
}

async function streamEvents(method, template, { names, params, signal, onEvent }) {
  const response = await checked(await fetch(url(template, names, params), { method, headers: headers(), signal }));
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
