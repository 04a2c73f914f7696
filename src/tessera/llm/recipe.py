"""Recipes: one YAML file describes a whole LLM training run; `key.path=value` overrides adjust it.

The merged config is validated before anything starts (no process group, no download): an unknown key
gets a did-you-mean, a wrong type names the key and the type expected, and batch arithmetic that cannot
work says which numbers clash. The typed tree below is the documentation of every key.
"""

from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tessera.llm.model import GPTConfig


class RecipeError(ValueError):
    """The recipe (after overrides) is not a valid run; the message names the key."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class StreamSpec(Strict):
    """One dataset of the mix (tessera.stream.Stream)."""

    remote: str | None = None
    local: str | None = None
    split: str | None = None
    proportion: float | None = None
    repeat: float | None = None
    choose: int | None = None


class LoaderSpec(Strict):
    streams: list[StreamSpec]
    shuffle: bool = True
    shuffle_seed: int = 9176
    num_canonical_nodes: int | None = None
    shuffle_block_size: int | None = None
    cache_limit: str | None = None
    num_workers: int = 0
    # How LLM Foundry's older `bytes` token columns decode (its own option's name and default; llm/tokens.py)
    token_encoding_type: Literal["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"] = "int64"


class EvalSpec(LoaderSpec):
    shuffle: bool = False
    max_batches: int | None = None
    batch_size: int | None = None  # per device; default the training microbatch


class DataSpec(Strict):
    train: LoaderSpec
    eval: EvalSpec | None = None


class OptimizerSpec(Strict):
    name: Literal["decoupled_adamw", "adamw"] = "decoupled_adamw"
    lr: float = 6e-4
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.0


class SchedulerSpec(Strict):
    name: Literal["cosine_with_warmup", "linear_with_warmup", "constant_with_warmup"] = "cosine_with_warmup"
    t_warmup: str = "0ba"
    alpha_f: float = 0.1


class Recipe(Strict):
    """A training run. Times are strings with units: ba, ep, sp, tok, dur."""

    run_name: str = "run"
    seed: int = 17
    model: dict[str, Any] = Field(default_factory=lambda: {"name": "tiny"})
    tokenizer: str = "byte"
    data: DataSpec
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec)
    global_train_batch_size: int = Field(gt=0)
    device_train_microbatch_size: int | Literal["auto"] | None = None
    precision: Literal["fp32", "amp_bf16", "amp_fp16"] = "fp32"
    max_duration: str
    eval_interval: str | None = None
    log_interval: str = "10ba"
    save_folder: str | None = None
    save_interval: str | None = None
    save_num_checkpoints_to_keep: int | None = None
    autoresume: bool = False
    load_path: str | None = None
    loggers: list[str] = Field(default_factory=lambda: ["progress"])
    grad_clip_norm: float | None = 1.0
    torch_threads: int | None = None

    @model_validator(mode="after")
    def _check(self) -> Recipe:
        try:
            GPTConfig.from_dict(dict(self.model))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"model: {exc}") from None
        return self

    def gpt_config(self) -> GPTConfig:
        return GPTConfig.from_dict(dict(self.model))

    def check_batches(self, world_size: int) -> int:
        """The per-device batch; RecipeError naming the numbers when they cannot divide."""
        g, mb = self.global_train_batch_size, self.device_train_microbatch_size
        if g % world_size:
            raise RecipeError(f"global_train_batch_size={g} is not divisible by the world size {world_size} "
                              f"(ranks): pick a multiple of {world_size}")
        per_device = g // world_size
        if isinstance(mb, int) and (mb < 1 or per_device % mb):
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
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise RecipeError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe is a mapping of keys, got {type(data).__name__}")
    return data


def apply_override(tree: dict[str, Any], item: str) -> None:
    """Apply one `a.b.c=value` override; the value is parsed as YAML ("4" -> 4, "[1,2]" -> list)."""
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise RecipeError(f"override {item!r} must look like key.path=value")
    parts = key.strip().split(".")
    node = tree
    for i, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            node = node[int(part)]
            continue
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, (dict, list)):
            raise RecipeError(f"override {item!r}: {'.'.join(parts[:i + 1])} is a value, not a section")
        node = child
    value = yaml.safe_load(raw) if raw.strip() else None
    if isinstance(node, list):
        node[int(parts[-1])] = value
    else:
        node[parts[-1]] = value


def _field_names(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed at `loc` (for did-you-mean)."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int) or current is None:
            continue
        field = current.model_fields.get(part) if hasattr(current, "model_fields") else None
        ann = field.annotation if field else None
        for candidate in getattr(ann, "__args__", ()) + (ann,):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                current = candidate
                break
            inner = getattr(candidate, "__args__", ())
            hit = next((c for c in inner if isinstance(c, type) and issubclass(c, BaseModel)), None)
            if hit:
                current = hit
                break
        else:
            current = None
    return list(current.model_fields) if current is not None and hasattr(current, "model_fields") else []


def _explain(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = ".".join(str(p) for p in loc)
        if err["type"] == "extra_forbidden":
            close = difflib.get_close_matches(str(loc[-1]), _field_names(Recipe, loc), n=1)
            hint = f"; did you mean {'.'.join([*map(str, loc[:-1]), close[0]])!r}?" if close else ""
            lines.append(f"unknown key {key!r}{hint}")
        elif err["type"] == "missing":
            lines.append(f"missing key {key!r}")
        else:
            lines.append(f"{key}: {err['msg']} (got {err.get('input')!r})" if key else err["msg"])
    return "invalid recipe:\n  " + "\n  ".join(lines)


def load_recipe(path: str, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """Read a recipe (a path, or the name of a shipped one), apply overrides, validate."""
    tree = _read(path)
    for item in overrides:
        apply_override(tree, item)
    if "model" in tree and isinstance(tree["model"], dict):
        unknown = set(tree["model"]) - set(GPTConfig.__dataclass_fields__) - {"name"}
        for key in sorted(unknown):
            close = difflib.get_close_matches(key, list(GPTConfig.__dataclass_fields__), n=1)
            hint = f"; did you mean 'model.{close[0]}'?" if close else ""
            raise RecipeError(f"invalid recipe:\n  unknown key 'model.{key}'{hint}")
    try:
        return Recipe.model_validate(tree)
    except ValidationError as exc:
        raise RecipeError(_explain(exc)) from None
