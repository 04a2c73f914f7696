"""`tessera train RECIPE.yaml [key.path=value ...]`: train an LLM from one YAML file."""

from __future__ import annotations

import json
import logging

import typer
import yaml
from rich.console import Console

from tessera.llm.recipe import RecipeError, load_recipe, shipped_recipes

err = Console(stderr=True)
CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": False}


def train(recipe: str = typer.Argument(..., help="A recipe YAML file, or a shipped one: "
                                                 + ", ".join(shipped_recipes())),
          overrides: list[str] = typer.Argument(None, help="key.path=value overrides, e.g. model.n_layers=4."),
          print_config: bool = typer.Option(False, "--print-config", help="Print the merged config and exit."),
          as_json: bool = typer.Option(False, "--json", help="With --print-config: JSON instead of YAML.")) -> None:
    """Train a language model from a recipe (validated before anything starts)."""
    try:
        cfg = load_recipe(recipe, overrides or [])
    except RecipeError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    if print_config:
        data = cfg.model_dump(mode="json")
        typer.echo(json.dumps(data, indent=2) if as_json else yaml.safe_dump(data, sort_keys=False))
        return
    from tessera.llm.train_run import train as run  # torch is imported only when training

    logging.basicConfig(level=logging.WARNING, format="[%(name)s] %(message)s")
    logging.getLogger("tessera").setLevel(logging.INFO)  # resumption, checkpoints: what users look for

    try:
        code = run(cfg)
    except RecipeError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    raise typer.Exit(code)
