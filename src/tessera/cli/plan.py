"""`tessera train RECIPE --plan`: print what the recipe needs and should reach on a GPU type, then exit.

Kept apart from `cli/train.py` so that the training command's module does not import torch: a plan builds
the model on the meta device (llm/plan.py), which is torch's.
"""

from __future__ import annotations

import json

import typer

from tessera.cli.console import fail
from tessera.llm.recipe import RecipeError


def print_plan(recipe: str, overrides: list[str], gpu: str, nodes: int, gpus_per_node: int | None,
               efficiency: float | None, as_json: bool, debug: bool) -> None:
    """Exit 2 on a recipe or GPU name that is wrong (a model whose shape the plan cannot know included), 1 on
    a model.pretrained folder that holds no model; 0 otherwise, even when the plan does not fit (the
    printed warning says so and how to make it fit)."""
    from tessera.llm.plan import load_for_plan, plan_dict, plan_recipe, render
    from tessera.train.hardware import accelerator

    try:
        device = accelerator(gpu)
        cfg = load_for_plan(recipe, overrides)
        result = plan_recipe(cfg, device, nodes, gpus_per_node, efficiency)
    except (RecipeError, ValueError) as exc:
        fail(exc, code=2, debug=debug)
    except OSError as exc:
        fail(exc, code=1, debug=debug)
    if as_json:
        typer.echo(json.dumps(plan_dict(result, cfg)))
    else:
        typer.echo(render(result, cfg, recipe))
