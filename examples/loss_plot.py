"""The demo's loss curve as an SVG: axes with ticks and labels, train and eval loss, and a marker at the
checkpoint the killed run resumed from. Plain text output, so a browser shows it and a test can read it;
no plotting library needed."""

from __future__ import annotations

import math
from html import escape

WIDTH, HEIGHT = 760, 440
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 40, 60
TRAIN_COLOR, EVAL_COLOR, MARK_COLOR = "#1f77b4", "#ff7f0e", "#d62728"


def nice_ticks(lo: float, hi: float, count: int = 6) -> list[float]:
    """About `count` round values (1, 2 or 5 times a power of ten apart) covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(lo / step) * step
    ticks, value = [], first
    while value <= hi + step * 1e-9:
        if value >= lo - step * 1e-9:
            ticks.append(round(value, 10))
        value += step
    return ticks


def _label(value: float) -> str:
    return f"{value:g}" if abs(value) >= 1 or value == 0 else f"{value:.2g}"


def loss_svg(train: list[tuple[int, float]], evals: list[tuple[int, float]], *, steps: int,
             resumed_from: int | None = None, title: str = "tessera quickstart") -> str:
    """An SVG document: x is the batch (step), y the loss; `resumed_from` draws the resume marker."""
    points = [v for _, v in train + evals if math.isfinite(v)]
    lo, hi = (min(points), max(points)) if points else (0.0, 1.0)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    pad = 0.05 * (hi - lo)
    lo, hi = lo - pad, hi + pad
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(step: float) -> float:
        return LEFT + plot_w * step / max(steps, 1)

    def y(value: float) -> float:
        return TOP + plot_h * (hi - value) / (hi - lo)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           f'<text x="{WIDTH / 2}" y="22" text-anchor="middle" font-size="14">{escape(title)}: loss per batch</text>',
           f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="black"/>']
    for tick in nice_ticks(0, steps):
        out.append(f'<line class="xtick" x1="{x(tick):.1f}" y1="{TOP + plot_h}" x2="{x(tick):.1f}" '
                   f'y2="{TOP + plot_h + 5}" stroke="black"/>')
        out.append(f'<text x="{x(tick):.1f}" y="{TOP + plot_h + 18}" text-anchor="middle">{_label(tick)}</text>')
    for tick in nice_ticks(lo, hi):
        out.append(f'<line class="ytick" x1="{LEFT - 5}" y1="{y(tick):.1f}" x2="{LEFT + plot_w}" y2="{y(tick):.1f}" '
                   f'stroke="#dddddd"/>')
        out.append(f'<text x="{LEFT - 8}" y="{y(tick) + 4:.1f}" text-anchor="end">{_label(tick)}</text>')
    out.append(f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 18}" text-anchor="middle">batch</text>')
    out.append(f'<text x="18" y="{TOP + plot_h / 2}" text-anchor="middle" '
               f'transform="rotate(-90 18 {TOP + plot_h / 2})">loss</text>')
    if resumed_from is not None:
        xr = x(resumed_from)
        out.append(f'<line id="resume" x1="{xr:.1f}" y1="{TOP}" x2="{xr:.1f}" y2="{TOP + plot_h}" '
                   f'stroke="{MARK_COLOR}" stroke-dasharray="6 4" stroke-width="1.5"/>')
        out.append(f'<text x="{xr + 6:.1f}" y="{TOP + 16}" fill="{MARK_COLOR}">killed -9, resumed from batch '
                   f'{resumed_from}</text>')
    for name, series, color in (("train", train, TRAIN_COLOR), ("eval", evals, EVAL_COLOR)):
        finite = sorted((s, v) for s, v in series if math.isfinite(v))
        if finite:
            path = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in finite)
            out.append(f'<polyline class="{name}" points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
            out += [f'<circle cx="{x(s):.1f}" cy="{y(v):.1f}" r="2.5" fill="{color}"/>' for s, v in finite]
    legend_x = LEFT + plot_w - 150
    for i, (name, color) in enumerate((("train loss", TRAIN_COLOR), ("eval loss", EVAL_COLOR))):
        ly = TOP + 40 + 18 * i
        out.append(f'<line x1="{legend_x}" y1="{ly}" x2="{legend_x + 24}" y2="{ly}" stroke="{color}" '
                   f'stroke-width="2"/>')
        out.append(f'<text x="{legend_x + 30}" y="{ly + 4}">{name}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
