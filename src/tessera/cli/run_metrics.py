"""`tessera run metrics NAME`: what a run reported (loss, learning rate, throughput), for those without a browser.

    tessera run metrics gpt-125m --plot     # loss and learning-rate curves drawn in the terminal (plotext)
    tessera run metrics gpt-125m            # the last rows as a table
    tessera run metrics gpt-125m --json     # every row, one JSON object per line

The rows are those the console plots (the platform's metrics store, `Platform.run_metrics`), so the same
keys go into the same charts: every loss-like key (`loss/train`, `train/loss`, `loss/eval`) into the
loss chart, `lr` and `lr/...` into the learning-rate chart, as the console's charts.js matches them. A
step reported twice (a resumed run logs its resumption step again) counts once, with its last value.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import sys
from typing import Any

import typer

from tessera.cli.console import err, fail
from tessera.platform import PlatformError

LOSS = re.compile(r"(^|/)loss($|/)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
PLAIN_MARKERS = ("braille", "dot", "+", "x")  # without colours, each series its own marker
Series = dict[str, tuple[list[float], list[float]]]


def is_lr(key: str) -> bool:
    return key == "lr" or key.startswith("lr/")


def series(rows: list[dict[str, Any]], wanted: Any) -> Series:
    """{key: (steps, values)} of the keys `wanted(key)` accepts, by step (the last value of a step counts)."""
    by_key: dict[str, dict[float, float]] = {}
    for row in rows:
        step = row.get("step")
        if not isinstance(step, int | float):
            continue
        for key, value in row.items():
            if key != "step" and wanted(key) and isinstance(value, int | float) and math.isfinite(value):
                by_key.setdefault(key, {})[step] = float(value)
    return {key: (sorted(points), [points[s] for s in sorted(points)]) for key, points in sorted(by_key.items())}


def chart(title: str, lines: Series, width: int, height: int, color: bool) -> str:
    """One plotext chart of `lines` against the step, `width` x `height` cells; ANSI colours only if `color`."""
    import plotext as plt

    plt.clear_figure()
    for i, (label, (steps, values)) in enumerate(lines.items()):
        plt.plot(steps, values, label=label, marker="braille" if color else PLAIN_MARKERS[i % len(PLAIN_MARKERS)])
    plt.title(title)
    plt.xlabel("step")
    plt.plotsize(width, height)
    plt.theme("pro" if color else "clear")
    text = plt.build()
    return text if color else ANSI.sub("", text)


def read_rows(platform: Any, name: str) -> list[dict[str, Any]]:
    """Every metric row of the run, oldest first (the store answers in pages)."""
    rows, after = [], 0
    while True:
        page, after_next = platform.run_metrics(name, after)
        rows += page
        if not page or after_next == after:
            return rows
        after = after_next


def plot(rows: list[dict[str, Any]], width: int, color: bool) -> str:
    """The loss chart and the learning-rate chart, one above the other; a note for what has no points."""
    parts = []
    for title, wanted, height in (("loss", LOSS.search, 20), ("learning rate", is_lr, 14)):
        lines = series(rows, wanted)
        parts.append(chart(title, lines, width, height, color) if lines else f"{title}: no points reported")
    return "\n\n".join(parts)


def table(rows: list[dict[str, Any]], last: int) -> str:
    """The last `last` steps' loss, learning rate and throughput keys, one line each."""
    keys = [k for k in dict.fromkeys(k for row in rows for k in row) if k != "step"
            and (LOSS.search(k) or is_lr(k) or k.startswith("throughput/"))]
    shown = rows[-last:]
    cells = [["step", *keys]] + [[str(row.get("step", "")), *(_cell(row.get(k)) for k in keys)] for row in shown]
    widths = [max(len(line[i]) for line in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in cells)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def metrics(name: str = typer.Argument(..., help="The run's name."),
            draw: bool = typer.Option(False, "--plot", help="Draw the loss and learning-rate curves in the "
                                                             "terminal."),
            last: int = typer.Option(20, "--last", min=1, help="Rows of the table (without --plot)."),
            as_json: bool = typer.Option(False, "--json", help="Every row, one JSON object per line.")) -> None:
    """The metrics a run reported: a table of the last steps, every row as JSON, or curves with --plot."""
    from tessera.platform.api.connection import connect

    try:
        rows = read_rows(connect(), name)
    except PlatformError as exc:
        fail(exc)
    if as_json:
        for row in rows:
            typer.echo(json.dumps(row))
        return
    if not rows:
        err.print(f"run {name} has reported no metrics yet")
        return
    if draw:
        terminal = sys.stdout.isatty()
        width = min(shutil.get_terminal_size((100, 40)).columns, 160)
        typer.echo(plot(rows, width, color=terminal))
        return
    typer.echo(table(rows, last))
