"""ICL task files: one JSON object per line, in LLM Foundry's shapes, read into typed items.

    language_modeling   {"context": "The capital of France is", "continuation": "Paris"}
    multiple_choice     {"query": "2 + 2 =", "choices": ["3", "4"], "gold": 1}
    schema              {"context_options": ["The cat sat", "The dog sat"], "continuation": "and purred", "gold": 0}
    question_answering  {"context": "Q: Capital of France?\\nA:", "answer": "Paris", "aliases": ["paris"]}

Text fields are stripped of surrounding whitespace as Foundry's loader does (lists are kept as they are),
so the delimiters alone decide the spacing. A file is a local path, a URL any `tessera.storage` store
reads (s3://, gs://, ...), or the name of a task shipped in tessera/llm/tasks/.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from tessera.storage import open_store, split_url


@dataclass(frozen=True)
class LMItem:
    context: str
    continuation: str


@dataclass(frozen=True)
class MCItem:
    query: str
    choices: tuple[str, ...]
    gold: int


@dataclass(frozen=True)
class SchemaItem:
    context_options: tuple[str, ...]
    continuation: str
    gold: int


@dataclass(frozen=True)
class QAItem:
    context: str
    answer: str
    aliases: tuple[str, ...]  # the answer and its aliases: any of them is right
    chain_of_thought: str = ""


Item = LMItem | MCItem | SchemaItem | QAItem
SHAPES = {"language_modeling": '{"context": str, "continuation": str}',
          "multiple_choice": '{"query": str, "choices": [str, ...], "gold": int}',
          "schema": '{"context_options": [str, ...], "continuation": str, "gold": int}',
          "question_answering": '{"context": str, "answer": str, "aliases": [str, ...] (optional)}'}


class TaskFileError(ValueError):
    """A task file that cannot be read or has an item of the wrong shape; names the file and line."""


def _text(obj: dict[str, Any], key: str) -> str:
    value = obj[key]
    if not isinstance(value, str):
        raise TypeError(f"{key!r} must be text, got {type(value).__name__}")
    return value.strip()


def _texts(obj: dict[str, Any], key: str, at_least: int) -> tuple[str, ...]:
    value = obj[key]
    if not isinstance(value, list) or len(value) < at_least or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{key!r} must be a list of at least {at_least} texts")
    return tuple(value)


def _gold(obj: dict[str, Any], options: tuple[str, ...]) -> int:
    gold = obj["gold"]
    if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(options):
        raise TypeError(f"'gold' must index the options (0..{len(options) - 1}), got {gold!r}")
    return gold


def parse_item(obj: dict[str, Any], task_type: str) -> Item:
    """One item of `task_type` from a decoded JSON line (KeyError/TypeError when it has another shape)."""
    if not isinstance(obj, dict):
        raise TypeError("each line must be a JSON object")
    if task_type == "language_modeling":
        return LMItem(_text(obj, "context"), _text(obj, "continuation"))
    if task_type == "multiple_choice":
        choices = _texts(obj, "choices", 2)
        return MCItem(_text(obj, "query"), choices, _gold(obj, choices))
    if task_type == "schema":
        options = _texts(obj, "context_options", 2)
        return SchemaItem(options, _text(obj, "continuation"), _gold(obj, options))
    if task_type == "question_answering":
        answer = _text(obj, "answer")
        aliases = _texts(obj, "aliases", 0) if "aliases" in obj else ()
        cot = _text(obj, "chain_of_thought") if "chain_of_thought" in obj else ""
        return QAItem(_text(obj, "context"), answer, tuple(dict.fromkeys((answer, *aliases))), cot)
    raise ValueError(f"unknown icl_task_type {task_type!r} (one of {', '.join(SHAPES)})")


def parse_lines(lines: list[str], task_type: str, where: str) -> list[Item]:
    items = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            items.append(parse_item(json.loads(line), task_type))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            detail = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
            raise TaskFileError(f"{where}:{number}: a {task_type} item is {SHAPES[task_type]} ({detail})") from None
    if not items:
        raise TaskFileError(f"{where}: no items")
    return items


def shipped_tasks() -> list[str]:
    folder = resources.files("tessera.llm") / "tasks"
    return sorted(p.name.removesuffix(".jsonl") for p in folder.iterdir() if p.name.endswith(".jsonl"))


def read_task_text(uri: str) -> tuple[str, str]:
    """(text, where) of a task file: a URL, a local path, or a shipped task's name."""
    if "://" in uri and not uri.startswith("file://"):
        parent, key = split_url(uri)
        return open_store(parent).get(key).decode("utf-8"), uri
    path = Path(uri.removeprefix("file://"))
    if path.is_file():
        return path.read_text(encoding="utf-8"), str(path)
    shipped = resources.files("tessera.llm") / "tasks" / f"{path.name.removesuffix('.jsonl')}.jsonl"
    if shipped.is_file() and len(path.parts) == 1:
        return shipped.read_text(encoding="utf-8"), f"tasks/{shipped.name}"
    raise FileNotFoundError(f"{uri}: no such task file or shipped task (shipped: {', '.join(shipped_tasks())})")


def load_items(uri: str, task_type: str) -> list[Item]:
    """The items of a task file (see the module docstring for where it may live)."""
    text, where = read_task_text(uri)
    return parse_lines(text.splitlines(), task_type, where)


def load_categories(uri: str, task_type: str) -> dict[str, list[Item]]:
    """The items of a task file grouped by their "category" key, sorted by name (Foundry's
    `has_categories`: each category is a task of its own, its few-shot examples drawn from itself)."""
    text, where = read_task_text(uri)
    lines = text.splitlines()
    categories: list[str | None] = []
    for number, line in enumerate(lines, 1):
        try:
            categories.append(str(json.loads(line)["category"]) if line.strip() else None)
        except (json.JSONDecodeError, KeyError, TypeError):
            raise TaskFileError(f"{where}:{number}: has_categories needs a \"category\" in every item") from None
    names = sorted({c for c in categories if c is not None})
    if not names:
        raise TaskFileError(f"{where}: no items")
    # other categories' lines left blank, so an error names the line of the file
    return {name: parse_lines([line if c == name else "" for line, c in zip(lines, categories, strict=True)],
                              task_type, where) for name in names}
