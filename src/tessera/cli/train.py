"""`tessera train RECIPE.yaml [key.path=value ...]`: train an LLM from one YAML file.

Bad input ends in one red line and no traceback (`--debug` shows it): exit 2 when the recipe or an
override is wrong (the same validation `--print-config` runs), 1 when something the recipe names cannot
be used (a missing dataset, tokenizer or bucket) or the run fails (a loss that is no longer finite).
"""

from __future__ import annotations

import json
import logging

import typer
import yaml

from tessera.cli.console import fail
from tessera.llm.recipe import RecipeError, load_recipe, recipe_keys, shipped_recipes
from tessera.shards import ShardError
from tessera.storage import StorageError

CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": False}


def train(recipe: str = typer.Argument(..., help="A recipe YAML file, or a shipped one: "
                                                 + ", ".join(shipped_recipes())),
          overrides: list[str] = typer.Argument(None, help="key.path=value overrides, e.g. model.n_layers=4."),
          print_config: bool = typer.Option(False, "--print-config", help="Print the merged config and exit."),
          as_json: bool = typer.Option(False, "--json", help="With --print-config or --plan: JSON."),
          plan: bool = typer.Option(False, "--plan", help="Print memory per GPU, FLOPs and expected tokens/s and "
                                                         "MFU for --gpu, then exit (no GPU needed)."),
          gpu: str = typer.Option("H100", "--gpu", help="With --plan: A100-40GB, A100-80GB, H100, H200 or trn1."),
          nodes: int = typer.Option(1, "--nodes", min=1, help="With --plan: nodes."),
          gpus_per_node: int = typer.Option(None, "--gpus-per-node", min=1, help="With --plan (default 8; trn1 16)."),
          efficiency: float = typer.Option(None, "--efficiency", min=0.01, max=1.0,
                                           help="With --plan: assumed hardware FLOPs utilisation (default 0.45)."),
          debug: bool = typer.Option(False, "--debug", help="On an error, show the Python traceback.")) -> None:
    """Train a language model from a recipe (validated before anything starts)."""
    if plan:
        from tessera.cli.plan import print_plan  # torch: only for a plan

        print_plan(recipe, overrides or [], gpu, nodes, gpus_per_node, efficiency, as_json, debug)
        return
    try:
        cfg = load_recipe(recipe, overrides or [])
    except RecipeError as exc:
        fail(exc, code=2, debug=debug)
    if print_config:
        data = cfg.dump()
        typer.echo(json.dumps(data, indent=2) if as_json else yaml.safe_dump(data, sort_keys=False))
        return
    from tessera.llm.train_run import DataUnavailable  # torch is imported only when training
    from tessera.llm.train_run import train as run
    from tessera.train.trainer import NonFiniteError

    logging.basicConfig(level=logging.WARNING, format="[%(name)s] %(message)s")
    logging.getLogger("tessera").setLevel(logging.INFO)  # resumption, checkpoints: what users look for

    try:
        code = run(cfg)
    except RecipeError as exc:
        fail(exc, code=2, debug=debug)
    except (ValueError, OSError, StorageError, ShardError, DataUnavailable, NonFiniteError) as exc:
        fail(exc, code=1, debug=debug)
    raise typer.Exit(code)


def keys_help() -> str:
    """Every recipe key with its type, default and meaning, from the recipe's schema (one per paragraph,
    since the help formatter joins single lines)."""
    rows = [f"{key} ({kind}, default {default}): {text}".rstrip(": ") for key, kind, default, text in recipe_keys()]
    text = "Recipe keys (set any with key.path=value):\n\n" + "\n\n".join(rows)
    return text.replace("[", "\\[")  # typer renders help as rich markup, where [x] would be a style tag


train.__doc__ = f"{train.__doc__}\n\n{keys_help()}"
