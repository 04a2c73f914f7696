// Building the page without innerHTML: every string from the server becomes a text node, so a run name
// or a log line can never be read as markup.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  setAttributes(el, attrs);
  append(el, children);
  return el;
}

const SVG_NS = "http://www.w3.org/2000/svg";

export function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  setAttributes(el, attrs);
  append(el, children);
  return el;
}

function setAttributes(el, attrs) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") el.addEventListener(name.slice(2), value);
    else el.setAttribute(name, value === true ? "" : String(value));
  }
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function clear(el) {
  el.replaceChildren();
  return el;
}

// --- banner -----------------------------------------------------------------------------------------

export function showBanner(message, kind = "error") {
  const banner = document.getElementById("banner");
  document.getElementById("banner-text").textContent = message;
  banner.className = `banner ${kind}`;
  banner.hidden = false;
}

export function hideBanner() {
  document.getElementById("banner").hidden = true;
}

// A failed poll shows a warning that the next good poll takes away; an action's error or answer stays
// until dismissed or replaced.
function clearPollWarning() {
  const banner = document.getElementById("banner");
  if (banner.classList.contains("warning")) banner.hidden = true;
}

// --- formatting -------------------------------------------------------------------------------------

export function age(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  const elapsed = Math.max(0, Date.now() / 1000 - seconds);
  if (elapsed < 60) return `${Math.floor(elapsed)}s`;
  if (elapsed < 3600) return `${Math.floor(elapsed / 60)}m`;
  if (elapsed < 86400) return `${Math.floor(elapsed / 3600)}h${Math.floor((elapsed % 3600) / 60)}m`;
  return `${Math.floor(elapsed / 86400)}d${Math.floor((elapsed % 86400) / 3600)}h`;
}

export function clock(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  return new Date(seconds * 1000).toLocaleString();
}

export function duration(start, end) {
  if (start === null || start === undefined) return "-";
  const total = Math.max(0, (end ?? Date.now() / 1000) - start);
  const h = Math.floor(total / 3600);
  const m = Math.floor((total % 3600) / 60);
  const sec = Math.floor(total % 60);
  return h ? `${h}h${m}m` : m ? `${m}m${sec}s` : `${sec}s`;
}

export function number(value) {
  if (typeof value !== "number" || !Number.isFinite(value)) return "-";
  const abs = Math.abs(value);
  if (abs !== 0 && (abs < 1e-3 || abs >= 1e6)) return value.toExponential(2);
  return Number(value.toPrecision(4)).toString();
}

export function statusBadge(status, attrs = {}) {
  return h("span", { ...attrs, class: `status status-${String(status).toLowerCase()}` }, status);
}

// Repeats `work` every `ms` milliseconds (and once now) until the returned stop function is called;
// a slow answer is never overlapped by the next call, and a failed one shows as a warning until one succeeds.
export function every(ms, work) {
  let stopped = false;
  let timer = null;
  const tick = async () => {
    try {
      await work();
      if (!stopped) clearPollWarning();
    } catch (error) {
      if (!stopped && error.name !== "AbortError") showBanner(error.message, "warning");
    } finally {
      if (!stopped) timer = setTimeout(tick, ms);
    }
  };
  tick();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
