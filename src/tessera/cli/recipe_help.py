"""`tessera train --list-keys` and `--help-all`: every recipe key, by section, with its type, default and
one line of meaning, generated from the typed recipe (`recipe_keys(Recipe)`, which reads the pydantic models and
GPTConfig's fields), so the list cannot drift from what `tessera train` accepts.

The default `--help` stays one screen (the command, its arguments, the options people use, examples);
what is left out is one flag away: `--help-all` shows every option and then this list.
"""

from __future__ import annotations

import json
import re
from typing import Any

import typer
from pydantic import BaseModel

from tessera.llm.recipe import Recipe
from tessera.llm.recipe_keys import recipe_keys

TOP = "run"  # the section of the keys at the top of a recipe (max_duration, seed, save_folder, ...)


def sections() -> dict[str, list[tuple[str, str, str, str]]]:
    """{section: [(key, type, default, meaning)]} in the recipe's own order, top-level keys first."""
    grouped: dict[str, list[tuple[str, str, str, str]]] = {TOP: []}
    for row in recipe_keys(Recipe):
        name = row[0].split(".", 1)[0] if "." in row[0] else TOP
        grouped.setdefault(name, []).append(row)
    return grouped


def _meaning(text: str) -> str:
    """The first line of a description (a key's line of meaning)."""
    return " ".join(text.strip().splitlines()[0].split()) if text.strip() else ""


def _section_title(name: str) -> str:
    """`optimizer:  # what the section is`: the recipe field's description, else its model's docstring."""
    field = Recipe.model_fields.get(name)
    if field is None:
        return f"{name}:  # keys at the top of the recipe"
    model = field.annotation if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel) else None
    about = field.description or (model.__doc__ if model is not None else "") or ""
    about = re.sub(r" \(`[^)]*\)", "", _meaning(about))  # "(`build` makes it)": for programmers, not here
    return f"{name}:" + (f"  # {about}" if about else "")


def keys_listing() -> str:
    """The text `--list-keys` prints."""
    lines = ["Recipe keys by section: set any with key.path=value (a list item: key.N.field).", ""]
    for name, rows in sections().items():
        lines.append(_section_title(name))
        for key, kind, default, text in rows:
            lines.append(f"  {key}  ({kind}; default {default if default.strip() else json.dumps(default)})")
            if _meaning(text):
                lines.append(f"      {_meaning(text)}")
        lines.append("")
    return "\n".join(lines)


def list_keys(value: bool) -> None:
    """`--list-keys`: print every recipe key and exit (eager: RECIPE may be left out)."""
    if value:
        typer.echo(keys_listing())
        raise typer.Exit()


def help_all(ctx: Any, value: bool) -> None:
    """`--help-all`: the help with the options `--help` leaves out, then every recipe key; exit."""
    if not value:
        return
    for param in ctx.command.params:
        param.hidden = False
    typer.echo(ctx.get_help())
    typer.echo("\n" + keys_listing())
    raise typer.Exit()
