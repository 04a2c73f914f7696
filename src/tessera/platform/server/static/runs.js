// #/runs: the team's runs, newest first, filtered by status and a name search, a page at a time (the API's
// limit/offset), refreshed every 2 s.

import { api, query } from "./api.js";
import { age, clear, every, h, statusBadge } from "./dom.js";

const STATUSES = ["PENDING", "QUEUED", "STARTING", "RUNNING", "STOPPING", "COMPLETED", "FAILED", "STOPPED"];
const PAGE_SIZES = [10, 25, 50, 100];
// kept while the tab lives, so going back to the list keeps the filter and the page
const filters = { status: "", q: "", size: 50, offset: 0 };

export function runsPage(view) {
  const status = h("select", { id: "status-filter", "aria-label": "Status" },
    h("option", { value: "" }, "All statuses"),
    STATUSES.map((name) => h("option", { value: name }, name)));
  status.value = filters.status;
  const search = h("input", { id: "run-search", type: "search", placeholder: "Search names", value: filters.q,
    "aria-label": "Search run names" });
  const size = h("select", { id: "page-size", "aria-label": "Runs per page" },
    PAGE_SIZES.map((n) => h("option", { value: n }, `${n} per page`)));
  size.value = String(filters.size);
  const count = h("span", { class: "muted", id: "runs-count" });
  const prev = h("button", { id: "prev-page", type: "button", class: "quiet", disabled: true }, "‹ Previous");
  const next = h("button", { id: "next-page", type: "button", class: "quiet", disabled: true }, "Next ›");
  const body = h("tbody");
  const table = h("table", { id: "runs-table", class: "table" },
    h("thead", {}, h("tr", {}, ["Name", "Status", "Cluster", "GPUs", "User", "Age"].map((c) => h("th", {}, c)))),
    body);

  clear(view).append(
    h("div", { class: "page-head" }, h("h1", {}, "Runs"), h("span", { class: "spacer" }), status, search),
    h("div", { class: "card" }, table,
      h("div", { class: "table-foot pager" }, count, h("span", { class: "spacer" }), size, prev, next)),
  );

  let latest = 0;   // a slow answer to an older filter or page must not overwrite a newer one
  const refresh = async () => {
    const asked = ++latest;
    const data = await api(`/runs${query({ status: filters.status, q: filters.q, limit: filters.size,
      offset: filters.offset })}`);
    if (asked !== latest) return;
    if (data.runs.length === 0 && filters.offset > 0) {   // the page emptied (runs deleted): go to the last one
      filters.offset = Math.max(0, Math.floor((data.total - 1) / filters.size) * filters.size);
      if (data.total > 0) return refresh();
    }
    render(body, data.runs);
    count.textContent = countText(data.total, data.runs.length);
    prev.disabled = filters.offset === 0;
    next.disabled = filters.offset + data.runs.length >= data.total;
  };
  const go = (change) => {
    change();
    refresh().catch(() => {});
  };
  status.addEventListener("change", () => go(() => { filters.status = status.value; filters.offset = 0; }));
  search.addEventListener("input", () => go(() => { filters.q = search.value.trim(); filters.offset = 0; }));
  size.addEventListener("change", () => go(() => { filters.size = Number(size.value); filters.offset = 0; }));
  prev.addEventListener("click", () => go(() => { filters.offset = Math.max(0, filters.offset - filters.size); }));
  next.addEventListener("click", () => go(() => { filters.offset += filters.size; }));
  return every(2000, refresh);
}

// "12 runs" when one page holds them all, else "11–12 of 12 runs".
function countText(total, shown) {
  if (filters.offset === 0 && shown >= total) return `${total} run${total === 1 ? "" : "s"}`;
  return `${filters.offset + 1}–${filters.offset + shown} of ${total} runs`;
}

function render(body, runs) {
  if (runs.length === 0) {
    clear(body).append(h("tr", {}, h("td", { colspan: 6, class: "muted empty" }, "No runs.")));
    return;
  }
  clear(body).append(...runs.map((run) => h("tr", { "data-run": run.name },
    h("td", {}, h("a", { href: `#/runs/${encodeURIComponent(run.name)}` }, run.name)),
    h("td", {}, statusBadge(run.status)),
    h("td", {}, run.cluster),
    h("td", { class: "num" }, gpuText(run)),
    h("td", {}, run.user || "-"),
    h("td", { class: "num", title: new Date(run.created * 1000).toLocaleString() }, age(run.created)),
  )));
}

function gpuText(run) {
  const gpus = run.gpus ?? 0;
  return run.nodes > 1 ? `${gpus} (${run.nodes} nodes)` : String(gpus);
}
