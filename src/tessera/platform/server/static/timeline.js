// The resumption timeline (every start of the run: why, where, on which nodes, how it ended) and the
// run's events, from /runs/NAME/events. Events arrive once each (each poll passes the cursor the last
// one gave); resumptions are redrawn.

import { runEvents } from "./api.js";
import { clear, clock, duration, h, statusBadge } from "./dom.js";

const MAX_EVENTS = 2000;

export class Timeline {
  constructor(name) {
    this.name = name;
    this.events = [];
    this.cursor = null;   // where the events received so far end (the kept list may be trimmed)
    this.list = h("ol", { id: "resumption-timeline", class: "timeline" });
    this.eventBody = h("tbody");
    this.element = h("section", { class: "card" },
      h("div", { class: "card-head" }, h("h2", {}, "Resumptions")),
      this.list,
      h("details", { class: "events" },
        h("summary", {}, "Events"),
        h("table", { id: "events-table", class: "table compact" },
          h("thead", {}, h("tr", {}, h("th", {}, "Time"), h("th", {}, "Kind"), h("th", {}, "Message"))),
          this.eventBody)));
  }

  async poll() {
    const data = await runEvents(this.name, this.cursor);
    renderResumptions(this.list, data.resumptions || []);
    this.cursor = data.next_cursor;
    if (data.items.length) {
      this.events.push(...data.items);
      if (this.events.length > MAX_EVENTS) this.events.splice(0, this.events.length - MAX_EVENTS);
      renderEvents(this.eventBody, this.events);
    }
  }
}

function renderResumptions(list, resumptions) {
  if (resumptions.length === 0) {
    clear(list).append(h("li", { class: "muted" }, "Not started yet."));
    return;
  }
  clear(list).append(...resumptions.slice().reverse().map((r) => h("li", { class: "resumption" },
    h("div", { class: "resumption-head" },
      h("strong", {}, `#${r.index}`), " ", statusBadge(r.status), " ",
      h("span", { class: "cause" }, r.cause), " on ", h("span", {}, r.cluster)),
    h("div", { class: "muted" },
      `nodes: ${(r.nodes || []).join(", ") || "-"} · started ${clock(r.start ?? r.submitted)} · ran ${duration(r.start, r.end)}`),
    outcomeLine(r),
  )));
}

function outcomeLine(r) {
  if (!r.outcome && r.exit_code === null && !r.detail) return null;
  const parts = [r.outcome || "ended"];
  if (r.exit_code !== null && r.exit_code !== undefined) parts.push(`exit ${r.exit_code}`);
  if (r.detail) parts.push(r.detail);
  return h("div", { class: `outcome outcome-${String(r.status).toLowerCase()}` }, parts.join(" · "));
}

function renderEvents(body, events) {
  clear(body).append(...events.slice().reverse().map((e) => h("tr", {},
    h("td", { class: "nowrap" }, clock(e.time)), h("td", {}, e.kind), h("td", {}, e.message))));
}
