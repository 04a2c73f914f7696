// #/runs: the team's runs, newest first, filtered by status and a name search, a page at a time (the API's
// cursors: Next passes the page's next_cursor, Previous goes back to the cursor the page before was asked
// with), refreshed every 2 s. Runs submitted meanwhile come before the first page, so no page shifts.

import { listRuns } from "./api.js";
import { age, clear, every, h, statusBadge } from "./dom.js";

const STATUSES = ["PENDING", "QUEUED", "STARTING", "RUNNING", "STOPPING", "COMPLETED", "FAILED", "STOPPED"];
const PAGE_SIZES = [10, 25, 50, 100];
// kept while the tab lives, so going back to the list keeps the filter and the page. `cursors` holds the
// cursor each page up to the current one was asked with (null: the first page).
const filters = { status: "", q: "", size: 50, cursors: [null] };

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
  let nextCursor = null;
  const refresh = async () => {
    const asked = ++latest;
    const data = await listRuns({ status: filters.status, q: filters.q, limit: filters.size,
      cursor: filters.cursors[filters.cursors.length - 1] });
    if (asked !== latest) return;
    if (data.items.length === 0 && filters.cursors.length > 1) {   // the page emptied (runs deleted): go back
      filters.cursors.pop();
      return refresh();
    }
    render(body, data.items);
    count.textContent = countText(data.total, data.items.length);
    prev.disabled = filters.cursors.length === 1;
    next.disabled = data.next_cursor === null;
    nextCursor = data.next_cursor;
  };
  const go = (change) => {
    change();
    nextCursor = null;   // until the new page's answer: a second click must not reuse this page's cursor
    refresh().catch(() => {});
  };
  const first = () => { filters.cursors = [null]; };
  status.addEventListener("change", () => go(() => { filters.status = status.value; first(); }));
  search.addEventListener("input", () => go(() => { filters.q = search.value.trim(); first(); }));
  size.addEventListener("change", () => go(() => { filters.size = Number(size.value); first(); }));
  prev.addEventListener("click", () => go(() => { if (filters.cursors.length > 1) filters.cursors.pop(); }));
  next.addEventListener("click", () => go(() => { if (nextCursor) filters.cursors.push(nextCursor); }));
  return every(2000, refresh);
}

// "12 runs" when one page holds them all, else "11–12 of 12 runs" (the pages before were full).
function countText(total, shown) {
  const start = (filters.cursors.length - 1) * filters.size;
  if (start === 0 && shown >= total) return `${total} run${total === 1 ? "" : "s"}`;
  return `${start + 1}–${start + shown} of ${total} runs`;
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
