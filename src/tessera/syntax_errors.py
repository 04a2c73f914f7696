"""Syntax errors that point at the line: a YAML or JSON file that does not parse (a recipe, a run spec, an
MCLI YAML, index.json, a JSONL data file) is refused with the file, the line and the column, and the line
itself with a caret under the column, as compilers show it:

    recipe.yaml: not valid YAML: mapping values are not allowed here (line 3, column 12)
        3 | model: name: tiny
          |            ^

The first line reads as every other one-line error of Tessera (`FILE: what is wrong`); the two after it
let a person see the mistake without opening the file. Where a layer's errors must stay one line (shards:
`data verify` lists them, one a line), the excerpt rides along as the exception's `excerpt` attribute
(`with_excerpt`), which the command line prints under the message. The module imports nothing of Tessera,
so every layer (shards, llm, the platform) can use it.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

E = TypeVar("E", bound=BaseException)

# PyYAML's contexts of something begun on one line and found unfinished on a later one.
UNFINISHED = ("while parsing a flow", "while scanning a quoted", "while scanning a simple key")
SHOWN = 72  # at most this many characters of the line (a JSONL record or a one-line index.json is long)


def excerpt(text: str, column: int, number: int | None = None) -> str:
    """`\\n  N | the line\\n    |   ^`: the line (cut around `column`, 1-based, when long) and a caret."""
    text = text.rstrip("\r\n").replace("\t", " ")
    start = max(0, min(column - 1 - SHOWN // 2, len(text) - SHOWN))
    shown = text[start:start + SHOWN]
    caret = column - 1 - start
    if start > 0:
        shown, caret = "…" + shown, caret + 1
    if start + SHOWN < len(text):
        shown += "…"
    shown = "".join(ch if ch.isprintable() else "?" for ch in shown)
    gutter = f"{number} | " if number is not None else "| "
    return f"\n    {gutter}{shown}\n    {' ' * (len(gutter) - 2)}| {' ' * max(caret, 0)}^"


def at(problem: str, text: str, line: int, column: int) -> str:
    """`PROBLEM (line L, column C)` and the excerpt of `text` there (`line`, `column`: 1-based)."""
    return f"{problem} (line {line}, column {column})" + excerpt(line_of(text, line), column, line)


def line_of(text: str, line: int) -> str:
    """Line `line` (1-based) of `text`, found without splitting the whole text (an index.json of a million
    shards is large enough already)."""
    start = 0
    for _ in range(line - 1):
        start = text.find("\n", start) + 1
        if start == 0:
            return ""
    end = text.find("\n", start)
    return text[start:end if end >= 0 else len(text)]


def yaml_error(exc: Exception, text: str, source: str, what: str = "not valid YAML") -> str:
    """`SOURCE: WHAT: problem (line L, column C)` and the excerpt, for a PyYAML error (its mark says
    where); one line when it has no mark. A bracket, quote or key left unfinished is only noticed on a
    later line: the error then names the line where it began, which is where the mistake is, and shows
    both lines."""
    mark: Any = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
    context, began = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if mark is None:
        return f"{source}: {what}: {problem}"
    if not (context and getattr(exc, "problem", None)):
        return f"{source}: " + at(f"{what}: {problem}", text, mark.line + 1, mark.column + 1)
    context = " ".join(str(context).split())
    if began is None or began.line == mark.line or not context.startswith(UNFINISHED):
        return f"{source}: " + at(f"{what}: {problem} ({context})", text, mark.line + 1, mark.column + 1)
    found = line_of(text, mark.line + 1)
    return (f"{source}: " + at(f"{what}: {problem} on line {mark.line + 1} ({context} that starts here)", text,
                               began.line + 1, began.column + 1)
            + (excerpt(found, mark.column + 1, mark.line + 1) if found.strip() else ""))


def json_problem(exc: json.JSONDecodeError, what: str = "not valid JSON") -> str:
    """`WHAT: problem (line L, column C)`, one line, for errors of a layer whose messages stay one line
    (shards: `data verify` lists them); `json_excerpt` goes beside it (`with_excerpt`)."""
    return f"{what}: {exc.msg} (line {exc.lineno}, column {exc.colno})"


def json_excerpt(exc: json.JSONDecodeError) -> str:
    """The excerpt of the line the JSON error is on."""
    return excerpt(line_of(exc.doc, exc.lineno), exc.colno, exc.lineno)


def with_excerpt(error: E, shown: str) -> E:
    """`error`, carrying `shown` (an `excerpt`) for the command line to print under its one-line message
    (cli/console.py `fail`); it survives pickling, as an exception's attributes do."""
    error.excerpt = shown  # type: ignore[attr-defined]
    return error
