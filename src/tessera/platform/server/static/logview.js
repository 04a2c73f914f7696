// A run's live logs: streamed from /runs/NAME/logs?follow=1 (server-sent events read through fetch, so
// the API key travels in a header), one rank or all, one resumption or the newest and on into the next.

import { followLogs } from "./api.js";
import { clear, h } from "./dom.js";

const MAX_LINES = 5000;   // older lines are dropped so a chatty run cannot exhaust the tab
const RETRY_MS = 2000;

export class LogView {
  constructor(name) {
    this.name = name;
    this.rank = h("select", { id: "log-rank", "aria-label": "Rank" }, h("option", { value: "" }, "All ranks"));
    this.resumption = h("select", { id: "log-resumption", "aria-label": "Resumption" },
      h("option", { value: "" }, "Newest resumption"));
    this.state = h("span", { class: "muted", id: "log-state" });
    this.pre = h("pre", { id: "log-view", class: "log", tabindex: 0 });
    this.element = h("section", { class: "card" },
      h("div", { class: "card-head" }, h("h2", {}, "Logs"), h("span", { class: "spacer" }), this.state,
        this.rank, this.resumption),
      this.pre);
    this.rank.addEventListener("change", () => this.start());
    this.resumption.addEventListener("change", () => this.start());
    this.controller = null;
    this.timer = null;
  }

  // Keep the selectors in step with the run: ranks from its spec, resumptions as they appear.
  update(run) {
    const compute = run.spec.compute || {};
    const world = (compute.nodes || 1) * (compute.procs_per_node || compute.gpus_per_node || 1);
    fillOptions(this.rank, Array.from({ length: world }, (_, i) => [String(i), `Rank ${i}`]));
    fillOptions(this.resumption, run.resumptions.map((r) => [String(r.index), `Resumption ${r.index} (${r.cause})`]));
  }

  start() {
    this.stop();
    const controller = new AbortController();
    this.controller = controller;
    clear(this.pre);
    this.state.textContent = "following";
    followLogs(this.name, { rank: this.rank.value, resumption: this.resumption.value }, {
      signal: controller.signal,
      onEvent: (type, data) => {
        if (type === "message") this.append(data);
      },
    }).then((ended) => {
      if (controller.signal.aborted) return;
      if (ended) {
        this.state.textContent = "run ended";
      } else {
        this.retryLater(controller, "stream closed; reconnecting");
      }
    }, (error) => {
      if (!controller.signal.aborted) this.retryLater(controller, `logs unavailable (${error.message}); retrying`);
    });
  }

  retryLater(controller, message) {
    this.state.textContent = message;
    this.timer = setTimeout(() => {
      if (this.controller === controller) this.start();
    }, RETRY_MS);
  }

  stop() {
    clearTimeout(this.timer);
    if (this.controller) this.controller.abort();
    this.controller = null;
  }

  append(line) {
    const pre = this.pre;
    const atBottom = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 24;
    pre.append(document.createTextNode(`${line}\n`));
    while (pre.childNodes.length > MAX_LINES) pre.firstChild.remove();
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  }
}

// Adds the options that are missing (after the first, "all"/"newest" option); keeps the selection.
function fillOptions(select, entries) {
  const have = new Set(Array.from(select.options, (o) => o.value));
  for (const [value, label] of entries) {
    if (!have.has(value)) select.append(h("option", { value }, label));
  }
}
