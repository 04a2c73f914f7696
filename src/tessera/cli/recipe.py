"""`tessera recipe convert FOUNDRY.yaml [key.path=value ...] [-o OUT]`: an LLM Foundry train YAML written
as the Tessera recipe it trains as, for those who move for good.

The conversion is the one `tessera train FOUNDRY.yaml` runs (llm/foundry/): the same overrides (Foundry's
dotted form), the same warnings, the same one-line refusals (exit 2). The recipe written is the
validated one, every key spelled out, so `tessera train OUT` trains exactly what `tessera train
FOUNDRY.yaml` would (except run_name, left to the new file's name unless the YAML or an override set it).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import typer
import yaml

from tessera.cli.console import fail
from tessera.cli.train import one_line_warnings
from tessera.llm.recipe import RecipeError, load_recipe

app = typer.Typer(help="Tessera recipes: convert an LLM Foundry train YAML into one.", no_args_is_help=True)


@app.callback()
def _group() -> None:
    """Tessera recipes (a group, so `convert` stays a sub-command as more are added)."""


@app.command("convert", context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def convert(foundry_yaml: str = typer.Argument(..., help="An LLM Foundry train YAML (scripts/train/yamls/...)."),
            overrides: list[str] = typer.Argument(None, help="Foundry's dotted overrides, e.g. "
                                                             "variables.data_local=./c4 tokenizer.name=./tok."),
            out: str = typer.Option(None, "-o", "--out", help="Write the recipe here (default: print it)."),
            debug: bool = typer.Option(False, "--debug", help="On an error, show the Python traceback.")) -> None:
    """Write an LLM Foundry train YAML as a Tessera recipe (what `tessera train` would run)."""
    try:
        with one_line_warnings():
            recipe = load_recipe(foundry_yaml, overrides or [])
    except RecipeError as exc:
        fail(exc, code=2, debug=debug)
    dumped = recipe.dump()
    named = any(item.partition("=")[0].strip() == "run_name" for item in overrides or [])
    if not named and dumped.get("run_name") in (Path(foundry_yaml).stem, os.environ.get("RUN_NAME")):
        dumped.pop("run_name")  # the new file's stem names the run, as for any recipe
    text = (f"# Converted from LLM Foundry's {Path(foundry_yaml).name} by `tessera recipe convert`; "
            "docs/foundry.md says what each key became.\n" + yaml.safe_dump(dumped, sort_keys=False))
    if out is None:
        typer.echo(text, nl=False)
        return
    try:
        _write_atomically(Path(out), text)
    except OSError as exc:
        fail(f"{out}: cannot write the recipe ({exc.strerror or exc})", code=1, debug=debug)
    typer.echo(f"wrote {out}", err=True)


def _write_atomically(path: Path, text: str) -> None:
    """A temporary file beside `path`, renamed over it: a reader never sees half a recipe."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
