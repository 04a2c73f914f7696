// The run page's four plots, fed by /runs/NAME/metrics?after=N: rows arrive once each and are kept here.
// Key names differ between writers ("loss/train" or "train/loss", "lr" or "lr/opt0"), so each plot
// takes every numeric key its pattern matches, one line per key.

import { runMetrics } from "./api.js";
import { h, s } from "./dom.js";
import { linePlot } from "./plot.js";

const PLOTS = [
  { id: "loss-plot", title: "Loss", match: (key) => /(^|\/)loss($|\/)/.test(key) },
  { id: "lr-plot", title: "Learning rate", match: (key) => key === "lr" || key.startsWith("lr/") },
  { id: "throughput-plot", title: "Throughput (tokens/s)", match: (key) => key === "throughput/tokens_per_sec" },
  { id: "mfu-plot", title: "MFU", match: (key) => key === "throughput/mfu" || key === "mfu" },
];
const MAX_ROWS = 20000;

export class Charts {
  constructor(name) {
    this.name = name;
    this.rows = [];
    this.next = 0;
    this.svgs = PLOTS.map((plot) => s("svg", { id: plot.id, class: "plot", role: "img", "aria-label": plot.title }));
    this.plots = h("div", { class: "plots", hidden: true },
      PLOTS.map((plot, i) => h("figure", {}, h("figcaption", {}, plot.title), this.svgs[i])));
    this.empty = h("p", { class: "muted" }, "No metrics yet: a run reports them by appending JSON lines ",
      "({\"step\": 1, \"loss/train\": 2.3, ...}) to the file $TESSERA_METRICS names; tessera train does.");
    this.element = h("section", { class: "card" }, h("div", { class: "card-head" }, h("h2", {}, "Metrics")),
      this.empty, this.plots);
  }

  async poll() {
    const data = await runMetrics(this.name, this.next);
    this.next = data.next;
    if (data.rows.length === 0 && this.rows.length > 0) return;
    this.rows.push(...data.rows);
    if (this.rows.length > MAX_ROWS) this.rows.splice(0, this.rows.length - MAX_ROWS);
    this.draw();
  }

  draw() {
    this.plots.hidden = this.rows.length === 0;
    this.empty.hidden = this.rows.length > 0;
    PLOTS.forEach((plot, i) => linePlot(this.svgs[i], seriesOf(this.rows, plot.match)));
  }
}

// After a resume the run logs again from its last checkpoint, so a step can come twice: the later row
// wins (it is what the resumed run computed), and each line is drawn in step order, never doubling back.
function seriesOf(rows, match) {
  const byKey = new Map();
  rows.forEach((row, i) => {
    const x = Number.isFinite(row.step) ? row.step : i;
    for (const [key, value] of Object.entries(row)) {
      if (typeof value !== "number" || !match(key)) continue;
      if (!byKey.has(key)) byKey.set(key, new Map());
      byKey.get(key).set(x, value);
    }
  });
  return Array.from(byKey, ([label, points]) => ({ label, points: Array.from(points).sort((a, b) => a[0] - b[0]) }));
}
