"""`tessera train RECIPE.yaml [-n N] [key.path=value ...]`: train an LLM from one YAML file.

`-n N` starts N processes on this machine (torchrun, through `tessera.train.launch`), each running this
same command; under torchrun or an srun step the world is the job's. `--print-config` prints the merged
recipe and, as comments after it (a `parallel_plan` key with --json), the parallel plan resolved for that
world: mesh, dtypes, what is sharded, checkpointed and compiled.

Bad input ends in one red line and no traceback (`--debug` shows it): exit 2 when the recipe or an
override is wrong (the same validation `--print-config` runs, the parallel plan included: a tensor-parallel
degree that does not divide the world fails here, before any process starts), 1 when something the recipe
names cannot be used (a missing dataset, tokenizer or bucket) or the run fails (a loss that is no longer
finite).
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import typer
import yaml

from tessera.cli import recipe_help
from tessera.cli.console import fail
from tessera.llm.hf.config import is_pretrained
from tessera.llm.recipe import (
    Recipe,
    RecipeError,
    apply_override,
    load_recipe,
    load_recipe_leaving_unset,
    shipped_recipes,
)
from tessera.shards import ShardError
from tessera.storage import StorageError
from tessera.stream.world import resolve_world
from tessera.train.parallel import ParallelismError, resolve_plan

CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": False}
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # .../tessera/


def train(recipe: str = typer.Argument(..., help="A recipe YAML file, or a shipped one: "
                                                 + ", ".join(shipped_recipes())),
          overrides: list[str] = typer.Argument(None, help="key.path=value overrides, e.g. model.n_layers=4."),
          nproc: int = typer.Option(None, "-n", "--nproc-per-node", min=1,
                                    help="Processes to start on this machine (torchrun); default: one, or the "
                                         "job's world under torchrun or srun."),
          print_config: bool = typer.Option(False, "--print-config",
                                            help="Print the merged config and the parallel plan, and exit."),
          as_json: bool = typer.Option(False, "--json", help="With --print-config or --plan: JSON."),
          plan: bool = typer.Option(False, "--plan", help="Print memory per GPU, FLOPs and expected tokens/s and "
                                                         "MFU for --gpu, then exit (no GPU needed)."),
          gpu: str = typer.Option("H100", "--gpu", help="With --plan: A100-40GB, A100-80GB, H100, H200 or trn1."),
          nodes: int = typer.Option(1, "--nodes", min=1, help="With --plan: nodes."),
          gpus_per_node: int = typer.Option(None, "--gpus-per-node", min=1, hidden=True,
                                            help="With --plan (default 8; trn1 16)."),
          efficiency: float = typer.Option(None, "--efficiency", min=0.01, max=1.0, hidden=True,
                                           help="With --plan: assumed hardware FLOPs utilisation (default 0.45)."),
          debug: bool = typer.Option(False, "--debug", help="On an error, show the Python traceback."),
          list_keys: bool = typer.Option(False, "--list-keys", is_eager=True, callback=recipe_help.list_keys,
                                         help="Every recipe key by section: type, default, meaning."),
          help_all: bool = typer.Option(False, "--help-all", is_eager=True, callback=recipe_help.help_all,
                                        help="Every option, then every recipe key.")) -> None:
    """Train a language model from a recipe (validated before anything starts).

    Set any recipe key with key.path=value: --list-keys lists every key; --help-all shows all options."""
    if plan:
        from tessera.cli.plan import print_plan  # torch: only for a plan

        with one_line_warnings():
            print_plan(recipe, overrides or [], gpu, nodes, gpus_per_node or nproc, efficiency, as_json, debug)
        return
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ  # a process torchrun started
    try:
        with one_line_warnings():  # what an LLM Foundry YAML's translation says it does differently
            cfg, unset = (load_recipe_leaving_unset(recipe, overrides or []) if print_config
                          else (load_recipe(recipe, overrides or []), []))
        world, local = (nproc, nproc) if nproc and not launched else _job_world()
        parallel = resolve_plan(cfg.parallelism, world, local, _device_type(cfg), cfg.precision.value)
        cfg.check_batches(parallel.dp_degree)
    except (RecipeError, ParallelismError) as exc:
        fail(exc, code=2, debug=debug)
    if print_config:
        described = parallel.describe(_blocks(cfg))
        dumped = cfg.dump()
        for key in unset:  # shown as the recipe has them; training refuses them until they are set
            apply_override(dumped, f"{key}=???")
        if unset:
            typer.echo(f"note: {', '.join(unset)} must be set before training", err=True)
        if as_json:
            typer.echo(json.dumps({**dumped, "parallel_plan": described}, indent=2))
        else:
            comment = yaml.safe_dump({"parallel_plan": described}, sort_keys=False,
                                     default_flow_style=None).rstrip().splitlines()
            typer.echo(yaml.safe_dump(dumped, sort_keys=False)
                       + f"# resolved for {world} process(es):\n" + "\n".join(f"# {line}" for line in comment))
        return
    if nproc and nproc > 1 and not launched:
        raise typer.Exit(_launch(nproc, recipe, overrides or [], debug))
    from tessera.llm.train_run import DataUnavailable  # torch is imported only when training
    from tessera.llm.train_run import train as run
    from tessera.train.checkpoint import CheckpointError
    from tessera.train.nonfinite import NonFiniteError

    logging.basicConfig(level=logging.WARNING, format="[%(name)s] %(message)s")
    logging.getLogger("tessera").setLevel(logging.INFO)  # resumption, checkpoints: what users look for

    default_format, warnings.formatwarning = warnings.formatwarning, _one_line(warnings.formatwarning)
    try:
        code = run(cfg)
    except RecipeError as exc:
        fail(exc, code=2, debug=debug)
    except (ValueError, OSError, StorageError, ShardError, DataUnavailable, NonFiniteError, CheckpointError) as exc:
        fail(exc, code=1, debug=debug)  # CheckpointError: autoresume found checkpoints but none is usable
    finally:
        warnings.formatwarning = default_format
    raise typer.Exit(code)


@contextmanager
def one_line_warnings() -> Iterator[None]:
    """Tessera's own warnings as `warning: MESSAGE` lines while the block runs (`_one_line`)."""
    default, warnings.formatwarning = warnings.formatwarning, _one_line(warnings.formatwarning)
    try:
        yield
    finally:
        warnings.formatwarning = default


def _one_line(default: Callable[..., str]) -> Callable[..., str]:
    """A `warnings.formatwarning` that prints Tessera's own warnings (a damaged checkpoint skipped, a changed
    batch size) as `warning: MESSAGE`, one line each: the file, line and source line Python adds point
    into Tessera's code, of no use to the user. Other libraries' warnings keep `default`'s format."""

    def formatwarning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      line: str | None = None) -> str:
        if filename.startswith(_PACKAGE):
            return f"warning: {message}\n"
        return default(message, category, filename, lineno, line)

    return formatwarning


def _job_world() -> tuple[int, int]:
    """(processes, processes per node) of the job this command runs in (1 outside torchrun or srun)."""
    world = resolve_world()
    return world.world_size, world.local_world_size


def _device_type(cfg: Recipe) -> str:
    """Where the run will compute: the recipe's device, else a GPU when there is one."""
    if cfg.device:
        return str(cfg.device).split(":")[0]
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _blocks(cfg: Recipe) -> str:
    """The model's blocks as the plan names them (what is sharded, checkpointed and compiled)."""
    if is_pretrained(cfg.model):
        return "the decoder layers (the classes transformers lists in _no_split_modules)"
    n = cfg.gpt_config().n_layers
    return f"transformer.blocks.0..{n - 1}" if n > 1 else "transformer.blocks.0"


def _launch(nproc: int, recipe: str, overrides: list[str], debug: bool) -> int:
    """This command on `nproc` processes of this machine (torchrun runs `python -m tessera.cli.main train`
    in each); the exit code of the first that failed, else 0."""
    from tessera.train.launch import launch, plan_launch

    args = ["train", recipe, *overrides, *(["--debug"] if debug else [])]
    return launch(plan_launch(nproc, nnodes=1, env={}), "tessera.cli.main", args, module=True)

