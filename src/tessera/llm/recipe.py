"""Recipes: one YAML file describes a whole LLM training run; `key.path=value` overrides adjust it.

The merged config is validated before anything starts (no process group, no download): an unknown key
gets a did-you-mean, a wrong type names the key and the type expected, and batch arithmetic that cannot
work says which numbers clash.

A recipe composes the layers' own typed configs rather than restating them: its training keys are the
fields of the train layer's `TrainerConfig` (same types, checks and descriptions; a few defaults differ),
and its data section is made of the stream layer's `StreamingConfig` and `StreamConfig`. Key names are
LLM Foundry's. `recipe_keys(Recipe)` (recipe_keys.py) lists every key for `tessera train --list-keys`.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Collection
from functools import partial
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    model_validator,
)

from tessera.llm.finetune.config import ExampleSource
from tessera.llm.foundry import FoundryError, foundry_recipe, is_foundry
from tessera.llm.hf.config import LoraSpec, PretrainedSpec, is_pretrained
from tessera.llm.icl.config import ICLSection
from tessera.llm.model import GPTConfig
from tessera.llm.model_source import is_hub_id
from tessera.llm.recipe_keys import did_you_mean
from tessera.llm.recipe_required import must_be_set_message, placeholder_overrides, unset_keys
from tessera.stream.config import StreamConfig, StreamingConfig
from tessera.suggest import hint
from tessera.syntax_errors import yaml_error
from tessera.train.config import OptimizerConfig, SchedulerConfig, TrainerConfig
from tessera.train.logger_settings import as_mapping
from tessera.typed_config import error_lines

# Trainer settings a recipe spells as LLM Foundry does, and where (every other setting keeps its name).
TRAINER_KEYS_RENAMED = {"global_batch_size": "global_train_batch_size",
                        "eval_subset_num_batches": "data.eval.max_batches"}
# A recipe's defaults where they differ from the Trainer's (an LLM run logs less often and clips).
RECIPE_DEFAULTS = {"seed": 17, "grad_clip_norm": 1.0, "log_interval": "10ba"}


class RecipeError(ValueError):
    """The recipe (after overrides) is not a valid run; the message names the key."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, arbitrary_types_allowed=True,
                              validate_default=True)


def fields_of(source: type[BaseModel], name: str, *, base: type[BaseModel], exclude: Collection[str] = (),
              **defaults: Any) -> type[BaseModel]:
    """A model on `base` with `source`'s fields (their types, checks and descriptions travel with them),
    some with other defaults: how a layer's config is reused without restating it."""
    fields: dict[str, Any] = {}
    for key, info in source.model_fields.items():
        if key in exclude or (issubclass(base, source) and key not in defaults):
            continue
        info = copy.copy(info)
        if key in defaults:
            info.default, info.default_factory = defaults[key], None
        fields[key] = (info.annotation, info)
    return create_model(name, __base__=base, __doc__=source.__doc__, __module__=__name__, **fields)


class LoaderSpec(StreamingConfig, ExampleSource):
    """A loader of the run: the stream layer's dataset options, plus how token columns decode; or, with
    `path`, fine-tuning examples prepared on the fly (llm/finetune/config.py)."""

    streams: list[StreamConfig] = Field(default_factory=list, description="The datasets to mix (or set path).")

    # How LLM Foundry's older `bytes` token columns decode (its own option's name and default; llm/tokens.py)
    token_encoding_type: Literal["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"] = Field(
        "int64", description="How LLM Foundry's `bytes` token columns decode.")


TrainLoaderSpec = fields_of(LoaderSpec, "TrainLoaderSpec", base=LoaderSpec, shuffle=True)


class EvalSpec(LoaderSpec):
    max_batches: int | None = Field(None, ge=1, description="Evaluate on this many batches only (the "
                                                            "Trainer's eval_subset_num_batches).")
    batch_size: int | None = Field(None, ge=1, description="Per device; None: the training microbatch.")


class DataSpec(Strict):
    """What the run trains on (train) and evaluates at eval_interval (eval): MDS streams or examples."""

    train: TrainLoaderSpec  # type: ignore[valid-type]
    eval: EvalSpec | None = None


TrainingKeys = fields_of(TrainerConfig, "TrainingKeys", base=Strict, exclude=set(TRAINER_KEYS_RENAMED),
                         **RECIPE_DEFAULTS)


class Recipe(TrainingKeys, ICLSection):  # type: ignore[valid-type,misc]
    """A training run. Times are strings with units: ba, ep, sp, tok, dur. In-context-learning tasks
    (`icl_tasks`, `icl_subset_num_batches`, `eval_gauntlet`) are llm/icl/config.py's keys."""

    model: dict[str, Any] = Field(default_factory=lambda: {"name": "tiny"},
                                  description="GPT shape: name (tiny, mpt-125m...) and any GPTConfig field.")
    lora: LoraSpec | None = Field(None, description="LoRA adapters (omit for full fine-tuning); see llm/hf/config.py.")
    tokenizer: str = Field("byte", description="byte, or the path of a tokenizer JSON.")
    data: DataSpec
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    global_train_batch_size: int = Field(gt=0, description="Samples per step over all ranks (the Trainer's "
                                                           "global_batch_size).")

    @model_validator(mode="after")
    def _check(self) -> Recipe:
        try:
            if is_pretrained(self.model):  # a Hugging Face model: its keys are PretrainedSpec's
                PretrainedSpec.model_validate(self.model)
            else:
                GPTConfig.from_dict(dict(self.model))
        except ValidationError as exc:  # one line, as `model: key: problem`
            raise ValueError(f"model: {'; '.join(error_lines(exc))}") from None
        except (TypeError, ValueError, ArithmeticError) as exc:
            raise ValueError(f"model: {exc}") from None
        self.trainer_config()  # the settings' checks across keys (autoresume needs save_folder)
        return self

    def trainer_config(self) -> TrainerConfig:
        """The train layer's config of this run (the recipe's keys under the Trainer's names)."""
        settings = {name: getattr(self, name) for name in TrainerConfig.model_fields
                    if name not in TRAINER_KEYS_RENAMED}
        settings["global_batch_size"] = self.global_train_batch_size
        settings["eval_subset_num_batches"] = self.data.eval.max_batches if self.data.eval else None
        if self.save_folder and self.run_name:
            settings["save_folder"] = self.save_folder.replace("{run_name}", self.run_name)
        return TrainerConfig.of(settings)

    def gpt_config(self) -> GPTConfig:
        return GPTConfig.from_dict(dict(self.model))

    def dump(self) -> dict[str, Any]:
        """The recipe as plain YAML/JSON values, in the order recipes are written (the LLM's sections first)."""
        data = self.model_dump(mode="json")
        first = ["run_name", "seed", "model", "tokenizer", "data", "optimizer", "scheduler", "global_train_batch_size"]
        return {key: data[key] for key in first + [k for k in data if k not in first]}

    def check_batches(self, world_size: int) -> int:
        """The per-device batch; RecipeError naming the numbers when they cannot divide."""
        g, mb = self.global_train_batch_size, self.device_train_microbatch_size
        if g % world_size:
            raise RecipeError(f"global_train_batch_size={g} is not divisible by the world size {world_size} "
                              f"(ranks): pick a multiple of {world_size}")
        per_device = g // world_size
        # a microbatch of at least the per-device batch is the whole batch (the Trainer clamps it), so a
        # recipe written for one process also runs on several
        if isinstance(mb, int) and (mb < 1 or (mb < per_device and per_device % mb)):
            raise RecipeError(f"device_train_microbatch_size={mb} does not divide the per-device batch "
                              f"{per_device} (= global_train_batch_size {g} / world size {world_size})")
        return per_device


def shipped_recipes() -> list[str]:
    return sorted(p.name for p in resources.files("tessera.llm").joinpath("recipes").iterdir()
                  if p.name.endswith(".yaml"))


def _read(path: str) -> dict[str, Any]:
    file = Path(path)
    if not file.exists() and (resources.files("tessera.llm") / "recipes" / path).is_file():
        text = (resources.files("tessera.llm") / "recipes" / path).read_text()
    elif not file.exists():
        raise RecipeError(f"{path}: no such recipe file (shipped recipes: {', '.join(shipped_recipes())})")
    else:
        text = file.read_text()
    data = _yaml(text, path) or {}
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe is a mapping of keys, got {type(data).__name__}")
    return data


def _yaml(text: str, where: str) -> Any:
    """Plain YAML only: a syntax error, or a tag such as `!!python/object`, is refused naming the line and
    showing it with a caret under the column (syntax_errors.py)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RecipeError(yaml_error(exc, text, where, "not valid plain YAML")) from None
    except RecursionError:
        raise RecipeError(f"{where}: YAML nested too deeply") from None


def _list_index(items: list[Any], part: str, path: str, item: str) -> int:
    """`streams.0`: an existing position of a list (a list grows by setting it whole: `streams=[...]`)."""
    if not (part.isascii() and part.isdigit()) or int(part) >= len(items):
        raise RecipeError(f"override {item!r}: {path} is a list of {len(items)} item(s), so the index after it "
                          f"must be 0..{len(items) - 1}, got {part!r} (set the whole list to add items: "
                          f"{path}=[...])")
    return int(part)


def apply_override(tree: dict[str, Any], item: str) -> None:
    """Apply one `a.b.c=value` override; the value is parsed as YAML ("4" -> 4, "[1,2]" -> list)."""
    key, sep, raw = item.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(parts):
        raise RecipeError(f"override {item!r} must look like key.path=value")
    if parts[0] == "loggers" and len(parts) > 1 and not parts[1].isdigit():  # `loggers.mlflow.x=`: as a mapping
        tree["loggers"] = as_mapping(tree.get("loggers")) if tree.get("loggers") is not None else {}
    node: Any = tree
    for i, part in enumerate(parts[:-1]):
        path = ".".join(parts[:i])
        if isinstance(node, list):
            node = node[_list_index(node, part, path, item)]
        else:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            node = child
        if not isinstance(node, (dict, list)):
            raise RecipeError(f"override {item!r}: {'.'.join(parts[:i + 1])} is a value, not a section")
    value = _yaml(raw, f"override {item!r}") if raw.strip() else None
    if isinstance(node, list):
        node[_list_index(node, parts[-1], ".".join(parts[:-1]), item)] = value
    else:
        node[parts[-1]] = value


def _explain(exc: ValidationError) -> str:
    lines = error_lines(exc, partial(did_you_mean, Recipe))
    if len(lines) == 1:
        return f"invalid recipe: {lines[0]}"
    return "invalid recipe:\n  " + "\n  ".join(lines)


def load_recipe_leaving_unset(path: str, overrides: list[str] | tuple[str, ...] = ()) -> tuple[Recipe, list[str]]:
    """The recipe validated with its `???` values (data, buckets, model.pretrained) standing in as
    placeholders (recipe_required.py), and those keys: what `--print-config` and `--plan` show before the
    user has set them. Another model key left unset is still an error (a GPT's shape derives from it)."""
    tree = _overridden(path, overrides)
    unset = unset_keys(tree)
    if any(key.startswith("model.") and key != "model.pretrained" for key in unset):
        return _validated(tree), []  # raises, naming every unset key
    for item in placeholder_overrides(unset):
        apply_override(tree, item)
    return _validated(tree), unset


def load_recipe(path: str, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """Read a recipe (a path, or the name of a shipped one), apply overrides, validate."""
    return _validated(_overridden(path, overrides))


def _overridden(path: str, overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    tree = _read(path)
    if is_foundry(tree):  # LLM Foundry's train YAML: its own overrides and ${variables}, translated (llm/foundry/)
        try:
            tree = foundry_recipe(tree, overrides, path)
        except FoundryError as exc:
            raise RecipeError(f"{path}: {exc}") from None
    else:
        for item in overrides:
            apply_override(tree, item)
    tree["run_name"] = run_name_of(path, tree, overrides)
    return tree


def run_name_of(path: str, tree: dict[str, Any], overrides: list[str] | tuple[str, ...] = ()) -> str | None:
    """The run's name, which names its checkpoint and log folders ({run_name}): `run_name=` on the command
    line, else $RUN_NAME (the platform's run name: two platform runs of one recipe file never share a
    folder, and a resumed platform run keeps its name), else the recipe file's `run_name`, else the file's
    stem (`tiny-cpu` for tiny-cpu.yaml: the same command run twice on a laptop autoresumes)."""
    if any(item.partition("=")[0].strip() == "run_name" for item in overrides) and tree.get("run_name") is not None:
        return tree["run_name"]
    return os.environ.get("RUN_NAME") or tree.get("run_name") or Path(path).stem


def _validated(tree: dict[str, Any]) -> Recipe:
    if unset := unset_keys(tree):
        raise RecipeError(f"invalid recipe: {must_be_set_message(unset)}")
    if "model" in tree and isinstance(tree["model"], dict) and not is_pretrained(tree["model"]):
        unknown = set(tree["model"]) - set(GPTConfig.__dataclass_fields__) - {"name"}
        for key in sorted(unknown):
            meant = hint(key, GPTConfig.__dataclass_fields__, prefix="model.")
            raise RecipeError(f"invalid recipe: unknown key 'model.{key}'{meant}")
    _absolute_pretrained(tree)
    try:
        return Recipe.model_validate(tree)
    except ValidationError as exc:
        raise RecipeError(_explain(exc)) from None


def _absolute_pretrained(tree: dict[str, Any]) -> None:
    """A local `model.pretrained` as an absolute path: the run config keeps it, and export or a resume
    started from another folder must find the same model (a URL is kept as it is, and so is a path that
    looks like a hub id, org/name, and is not there: it is refused by that name when the model loads)."""
    model = tree.get("model")
    if not is_pretrained(model) or not isinstance(model["pretrained"], str) or not model["pretrained"].strip():
        return
    local = os.path.expanduser(model["pretrained"])
    if "://" not in local and not (is_hub_id(local) and not os.path.exists(local)):
        model["pretrained"] = os.path.abspath(local)
