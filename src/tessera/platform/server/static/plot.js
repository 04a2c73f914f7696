// A small SVG line plot: no chart library, so the console loads nothing from anywhere but the server.
// linePlot(svg, series) redraws `svg` with one line per series; series = [{label, points: [[x, y], ...]}].
// Until a series has a point the plot shows "no data yet" and has no <path>.

import { clear, number, s } from "./dom.js";

const WIDTH = 480;
const HEIGHT = 200;
const MARGIN = { left: 56, right: 12, top: 12, bottom: 28 };
const COLORS = ["#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2"];

function extent(values) {
  let lo = Math.min(...values);
  let hi = Math.max(...values);
  if (lo === hi) {
    const pad = Math.abs(lo) * 0.05 || 1;
    lo -= pad;
    hi += pad;
  }
  return [lo, hi];
}

function scale([lo, hi], [from, to]) {
  return (value) => from + ((value - lo) / (hi - lo)) * (to - from);
}

export function linePlot(svg, series, { xLabel = "step" } = {}) {
  clear(svg);
  svg.setAttribute("viewBox", `0 0 ${WIDTH} ${HEIGHT}`);
  const drawn = series.map((one) => ({
    ...one, points: one.points.filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y)),
  })).filter((one) => one.points.length > 0);
  if (drawn.length === 0) {
    svg.append(s("text", { x: WIDTH / 2, y: HEIGHT / 2, class: "plot-empty", "text-anchor": "middle" },
      "no data yet"));
    return;
  }
  const all = drawn.flatMap((one) => one.points);
  const xs = extent(all.map(([x]) => x));
  const ys = extent(all.map(([, y]) => y));
  const x = scale(xs, [MARGIN.left, WIDTH - MARGIN.right]);
  const y = scale(ys, [HEIGHT - MARGIN.bottom, MARGIN.top]);

  svg.append(axes(xs, ys, x, y, xLabel));
  drawn.forEach((one, i) => {
    const color = COLORS[i % COLORS.length];
    const d = one.points.map(([px, py], j) => `${j ? "L" : "M"}${x(px).toFixed(1)},${y(py).toFixed(1)}`).join("");
    svg.append(s("path", { d, class: "plot-line", stroke: color }, s("title", {}, one.label)));
    if (one.points.length === 1) {
      const [px, py] = one.points[0];
      svg.append(s("circle", { cx: x(px), cy: y(py), r: 3, fill: color }));
    }
  });
  if (drawn.length > 1) svg.append(legend(drawn));
}

function axes(xs, ys, x, y, xLabel) {
  const group = s("g", { class: "plot-axes" });
  const bottom = HEIGHT - MARGIN.bottom;
  group.append(
    s("line", { x1: MARGIN.left, y1: bottom, x2: WIDTH - MARGIN.right, y2: bottom }),
    s("line", { x1: MARGIN.left, y1: MARGIN.top, x2: MARGIN.left, y2: bottom }),
  );
  for (const value of [ys[0], (ys[0] + ys[1]) / 2, ys[1]]) {
    group.append(
      s("line", { class: "plot-grid", x1: MARGIN.left, y1: y(value), x2: WIDTH - MARGIN.right, y2: y(value) }),
      s("text", { x: MARGIN.left - 6, y: y(value) + 4, "text-anchor": "end" }, number(value)),
    );
  }
  group.append(
    s("text", { x: MARGIN.left, y: HEIGHT - 8, "text-anchor": "start" }, number(xs[0])),
    s("text", { x: WIDTH - MARGIN.right, y: HEIGHT - 8, "text-anchor": "end" }, number(xs[1])),
    s("text", { x: (MARGIN.left + WIDTH - MARGIN.right) / 2, y: HEIGHT - 8, "text-anchor": "middle" }, xLabel),
  );
  return group;
}

function legend(drawn) {
  const group = s("g", { class: "plot-legend" });
  drawn.forEach((one, i) => {
    const top = MARGIN.top + 4 + i * 14;
    group.append(
      s("rect", { x: WIDTH - MARGIN.right - 130, y: top, width: 10, height: 3, fill: COLORS[i % COLORS.length] }),
      s("text", { x: WIDTH - MARGIN.right - 116, y: top + 5 }, one.label),
    );
  });
  return group;
}
