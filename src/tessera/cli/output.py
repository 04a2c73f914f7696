"""Lists that fit the terminal: `run list`, `cluster list`, `secret list`, `server admin list-users`.

What a person copies from a list is its first column (a run's name into the next command), so that column
is never cut. The other columns have a priority: when the line is wider than the terminal, columns that
may be shortened are cut (with `…`) down to their minimum, least important first, and if that is not
enough the least important column is dropped and the fit tried again. `--wide` shows every column, cut
nowhere, as does output into a pipe or a file when no `COLUMNS` is set (`grep` and `awk` get whole
values). Columns are separated by spaces, never by box drawing, as `kubectl get` and `gh` print them:
`--format table` (the default on a terminal) adds only bold headers and coloured states, `plain` (the
default elsewhere) is the same text without styles, `json` one object per line, complete, as `--json`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import typer
from rich.cells import cell_len, set_cell_size
from rich.text import Text

from tessera.cli.console import err, fail, out

GAP = 2  # spaces between columns
ELLIPSIS = "…"
FORMATS = ("table", "plain", "json")
STATE_STYLES = {"COMPLETED": "green", "RUNNING": "cyan", "FAILED": "red", "STOPPED": "yellow",
                "PENDING": "dim", "QUEUED": "dim", "STARTING": "cyan", "STOPPING": "yellow"}

WIDE = typer.Option(False, "--wide", "-w", help="Every column, none cut (wider than the terminal if need be).")
FORMAT = typer.Option(None, "--format", metavar="table|plain|json",
                      help="table (a terminal's default), plain (a pipe's: no styles) or json (as --json).")


@dataclass(frozen=True)
class Column:
    """One column of a list. `priority` 0 is never cut nor dropped (the name); a higher number is dropped
    sooner. `min_width`: the column may be cut down to this many characters (None: never cut, only
    dropped). `wide`: shown only with `--wide`. `styles`: a style per exact value (table format only)."""

    header: str
    priority: int = 1
    min_width: int | None = None
    wide: bool = False
    styles: Mapping[str, str] = field(default_factory=dict)


def terminal_width() -> int | None:
    """The width to fit: `COLUMNS` when set, else the terminal's; None when writing into a pipe or a file
    (nothing is cut then)."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns > 0:
        return columns
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def output_format(chosen: str | None, as_json: bool = False) -> str:
    """The format asked for (`--format`, `--json`), else `table` on a terminal and `plain` elsewhere."""
    if as_json:
        return "json"
    if chosen is None:
        return "table" if sys.stdout.isatty() else "plain"
    if chosen not in FORMATS:
        fail(f"--format {chosen!r}: choose one of {', '.join(FORMATS)}", code=2)
    return chosen


def clean(value: Any) -> str:
    """A cell as one line of printable text: None is `-`, whitespace runs (newlines too) are one space."""
    if value is None or value == "":
        return "-"
    text = " ".join(str(value).split())
    return "".join(ch if ch.isprintable() else "?" for ch in text)


def cut(text: str, width: int) -> str:
    """`text` in at most `width` cells, ending in `…` when it had to be cut."""
    if cell_len(text) <= width:
        return text
    return set_cell_size(text, max(width - 1, 0)).rstrip() + ELLIPSIS if width > 0 else ""


def _natural(columns: Sequence[Column], rows: Sequence[Sequence[str]], i: int) -> int:
    return max([cell_len(columns[i].header), *(cell_len(row[i]) for row in rows)])


def layout(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int | None,
           wide: bool = False) -> list[tuple[int, int]]:
    """(column index, width) of each column shown, in order, fitting `width` when it can: cut what may be
    cut, least important first, then drop the least important column and try again. Columns of priority
    0 are kept whole even when they alone are wider than `width`."""
    shown = [i for i, column in enumerate(columns) if wide or not column.wide]
    natural = {i: _natural(columns, rows, i) for i in shown}
    if wide or width is None:
        return [(i, natural[i]) for i in shown]
    dropped: list[int] = []
    while True:
        widths = _shrunk(columns, shown, natural, width)
        droppable = [i for i in shown if columns[i].priority > 0]
        if widths is not None or not droppable:
            break
        dropped.append(max(droppable, key=lambda i: (columns[i].priority, i)))
        shown.remove(dropped[-1])
    if widths is None:  # only never-cut columns left, and wider than `width`
        return [(i, natural[i]) for i in shown]
    for i in reversed(dropped):  # a column dropped to make room may fit beside what was kept (a short one)
        if sum(widths.values()) + GAP * len(widths) + natural[i] <= width:
            shown = sorted([*shown, i])
            widths[i] = natural[i]
    return [(i, widths[i]) for i in shown]


def _shrunk(columns: Sequence[Column], shown: list[int], natural: Mapping[int, int],
            width: int) -> dict[int, int] | None:
    """Widths of `shown` fitting `width`, cutting columns that may be cut (least important first) only
    as far as needed; None if they cannot fit."""
    widths = {i: natural[i] for i in shown}
    excess = sum(widths.values()) + GAP * (len(shown) - 1) - width
    for i in sorted(shown, key=lambda i: (-columns[i].priority, -i)):
        minimum = columns[i].min_width
        if excess <= 0 or minimum is None or columns[i].priority == 0:
            continue
        shrink = min(excess, max(widths[i] - max(minimum, 1), 0))
        widths[i] -= shrink
        excess -= shrink
    return widths if excess <= 0 else None


def render(columns: Sequence[Column], rows: Iterable[Sequence[Any]], width: int | None,
           wide: bool = False, styled: bool = False) -> list[Text]:
    """The header and the rows as lines fitted to `width` (see `layout`); trailing spaces stripped."""
    cells = [[clean(value) for value in row] for row in rows]
    placed = layout(columns, cells, width, wide)
    lines = []
    for r, row in enumerate([[c.header for c in columns], *cells]):
        line = Text(style="bold" if styled and r == 0 else "")
        for n, (i, w) in enumerate(placed):
            text = cut(row[i], w)
            last = n == len(placed) - 1
            style = columns[i].styles.get(row[i]) if styled and r > 0 else None
            line.append(text, style=style)
            if not last:
                line.append(" " * (w - cell_len(text) + GAP))
        line.rstrip()
        lines.append(line)
    return lines


def print_list(columns: Sequence[Column], records: Sequence[Any], cells: Callable[[Any], Sequence[Any]], fmt: str, wide: bool = False,
               as_json: Callable[[Any], str] = json.dumps, empty: str = "") -> None:
    """Print `records` in `fmt` (see `output_format`): a JSON line each (`as_json`), or the fitted table of
    `cells(record)` under `columns`; with no records, `empty` on stderr (stdout stays empty for scripts)."""
    if fmt == "json":
        for record in records:
            typer.echo(as_json(record))
        return
    if not records and empty:
        err.print(empty, highlight=False)
        return
    for line in render(columns, [cells(r) for r in records], terminal_width(), wide, styled=fmt == "table"):
        out.print(line, soft_wrap=True, highlight=False)


def short_time(t: float | None, now: float | None = None) -> str:
    """A time in a list: `12-03 07:11` this year, `2025-12-03` before; `-` for none."""
    if not t:
        return "-"
    when = time.localtime(t)
    if when.tm_year != time.localtime(now if now is not None else time.time()).tm_year:
        return time.strftime("%Y-%m-%d", when)
    return time.strftime("%m-%d %H:%M", when)


def long_time(t: float | None) -> str:
    """A time in `describe`: `2026-12-03 07:11:02`; `-` for none. Absolute, so two calls print the same."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"
