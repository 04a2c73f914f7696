// #/runs/NAME: the run's status and spec, its buttons (stop, restart, move, clone), live logs,
// resumption timeline and metric plots. Status, events and metrics are polled every 2 s; logs stream.

import { cloneRun, getRun, listClusters, moveRun, restartRun, stopRun } from "./api.js";
import { ask } from "./ask.js";
import { Charts } from "./charts.js";
import { age, clear, clock, every, h, showBanner, statusBadge } from "./dom.js";
import { LogView } from "./logview.js";
import { Timeline } from "./timeline.js";

const TERMINAL = new Set(["COMPLETED", "FAILED", "STOPPED"]);

export function runPage(view, name) {
  const status = h("span", { id: "run-status" });
  const facts = h("dl", { class: "facts" });
  const spec = h("pre", { id: "run-spec", class: "spec" });
  const buttons = {
    stop: h("button", { id: "stop-button", type: "button", class: "danger" }, "Stop"),
    restart: h("button", { id: "restart-button", type: "button" }, "Restart"),
    move: h("button", { id: "move-button", type: "button" }, "Move"),
    clone: h("button", { id: "clone-button", type: "button" }, "Clone"),
  };
  const logs = new LogView(name);
  const timeline = new Timeline(name);
  const charts = new Charts(name);

  clear(view).append(
    h("div", { class: "page-head" },
      h("a", { href: "#/runs", class: "back" }, "\u2190 Runs"),
      h("h1", { id: "run-title" }, name), status,
      h("span", { class: "spacer" }), Object.values(buttons)),
    h("div", { class: "columns" },
      h("section", { class: "card" }, h("div", { class: "card-head" }, h("h2", {}, "Run")), facts),
      timeline.element),
    charts.element,
    logs.element,
    h("section", { class: "card" }, h("details", {}, h("summary", {}, "Spec"), spec)),
  );

  let run = null;
  const show = (fresh) => {
    const first = run === null;
    run = fresh;
    clear(status).append(statusBadge(run.status));
    renderFacts(facts, run);
    const specText = JSON.stringify(run.spec, null, 2);
    if (spec.textContent !== specText) spec.textContent = specText;   // keeps a selection across polls
    buttons.stop.disabled = TERMINAL.has(run.status) || run.status === "STOPPING";
    buttons.move.disabled = TERMINAL.has(run.status);
    logs.update(run);
    if (first) logs.start();
  };
  const act = async (verb, request, message) => {
    try {
      show(await request());
      showBanner(message, "info");
    } catch (error) {
      showBanner(`${verb} failed: ${error.message}`);
    }
  };

  buttons.stop.addEventListener("click", () => act("stop", () => stopRun(name), `Stopping ${name}.`));
  buttons.restart.addEventListener("click", async () => {
    await act("restart", () => restartRun(name), `Restarting ${name}.`);
    logs.start();
  });
  buttons.move.addEventListener("click", async () => {
    const cluster = await ask(`Move ${name}`, "To cluster", { options: await clusterNames() });
    if (cluster) await act("move", () => moveRun(name, cluster), `Moving ${name} to ${cluster}.`);
  });
  buttons.clone.addEventListener("click", async () => {
    const newName = await ask(`Clone ${name}`, "New run name", { value: `${name}-clone` });
    if (!newName) return;
    try {
      const copy = await cloneRun(name, newName);
      location.hash = `#/runs/${encodeURIComponent(copy.name)}`;
    } catch (error) {
      showBanner(`clone failed: ${error.message}`);
    }
  });

  const stopPolling = every(2000, async () => {
    show(await getRun(name));
    await Promise.all([timeline.poll(), charts.poll()]);
  });
  return () => {
    stopPolling();
    logs.stop();
  };
}

async function clusterNames() {
  try {
    const { clusters } = await listClusters();
    return clusters.map((c) => c.name);
  } catch {
    return [];   // suggestions only: the user can still type a name
  }
}

function renderFacts(facts, run) {
  const compute = run.spec.compute || {};
  const rows = [
    ["Cluster", run.cluster],
    ["User", run.user || "-"],
    ["GPUs", `${(compute.gpus_per_node || 0) * (compute.nodes || 1)} (${compute.nodes || 1} node${compute.nodes > 1 ? "s" : ""})`],
    ["Created", `${clock(run.created)} (${age(run.created)} ago)`],
    ["Ended", clock(run.ended)],
    ["Resumptions", String(run.resumptions.length)],
    ["Retries used", String(run.retries_used ?? 0)],
  ];
  if (run.request) rows.push(["Request", run.request]);
  if (run.first_error) rows.push(["First error", run.first_error]);
  if (run.failure_kind) rows.push(["Failure kind", run.failure_kind]);
  clear(facts).append(...rows.flatMap(([term, value]) => [h("dt", {}, term), h("dd", {}, value)]));
}
