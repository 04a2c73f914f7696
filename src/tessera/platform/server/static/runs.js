// #/runs: the team's runs, newest first, filtered by status and a name search, refreshed every 2 s.

import { api, query } from "./api.js";
import { age, clear, every, h, statusBadge } from "./dom.js";

const STATUSES = ["PENDING", "QUEUED", "STARTING", "RUNNING", "STOPPING", "COMPLETED", "FAILED", "STOPPED"];
const LIMIT = 200;
const filters = { status: "", q: "" };   // kept while the tab lives, so going back keeps the filter

export function runsPage(view) {
  const status = h("select", { id: "status-filter", "aria-label": "Status" },
    h("option", { value: "" }, "All statuses"),
    STATUSES.map((name) => h("option", { value: name }, name)));
  status.value = filters.status;
  const search = h("input", { id: "run-search", type: "search", placeholder: "Search names", value: filters.q,
    "aria-label": "Search run names" });
  const count = h("span", { class: "muted", id: "runs-count" });
  const body = h("tbody");
  const table = h("table", { id: "runs-table", class: "table" },
    h("thead", {}, h("tr", {}, ["Name", "Status", "Cluster", "GPUs", "User", "Age"].map((c) => h("th", {}, c)))),
    body);

  clear(view).append(
    h("div", { class: "page-head" }, h("h1", {}, "Runs"), h("span", { class: "spacer" }), status, search),
    h("div", { class: "card" }, table, h("p", { class: "table-foot" }, count)),
  );

  let latest = 0;   // a slow answer to an older filter must not overwrite a newer one
  const refresh = async () => {
    const asked = ++latest;
    const data = await api(`/runs${query({ status: filters.status, q: filters.q, limit: LIMIT })}`);
    if (asked !== latest) return;
    render(body, data.runs);
    count.textContent = data.total > data.runs.length
      ? `${data.runs.length} of ${data.total} runs` : `${data.total} run${data.total === 1 ? "" : "s"}`;
  };
  status.addEventListener("change", () => {
    filters.status = status.value;
    refresh().catch(() => {});
  });
  search.addEventListener("input", () => {
    filters.q = search.value.trim();
    refresh().catch(() => {});
  });
  return every(2000, refresh);
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
