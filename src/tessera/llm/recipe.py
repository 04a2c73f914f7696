"""Recipes: one YAML file describes a whole LLM training run; `key.path=value` overrides adjust it.

The merged config is validated before anything starts (no process group, no download): an unknown key
gets a did-you-mean, a wrong type names the key and the type expected, and batch arithmetic that cannot
work says which numbers clash. The typed tree below is the documentation of every key.
"""

from __future__ import annotations

import difflib
import math
from importlib import resources
from pathlib import Path
from typing import Any, Literal, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tessera.llm.model import GPTConfig
from tessera.storage import StorageError
from tessera.storage.url import parse_url
from tessera.train.config import check_run_name
from tessera.train.loggers import LOGGERS
from tessera.train.time import Time, TimeUnit


class RecipeError(ValueError):
    """The recipe (after overrides) is not a valid run; the message names the key."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def check_time(value: Any, *, allow_dur: bool = True, positive: bool = False) -> Any:
    """A time string ("500ba", "2ep", "0.1dur") checked now, so `--print-config` and training agree."""
    if value is None:
        return value
    try:
        time = Time.parse(value)
    except (TypeError, ValueError) as exc:  # pydantic reports ValueError only
        raise ValueError(str(exc)) from None
    if not allow_dur and time.unit is TimeUnit.DURATION:
        raise ValueError(f"must be in ba, ep, sp or tok, not {time}")
    if positive and time.value <= 0:
        raise ValueError(f"must be positive, got {time}")
    return value


def check_non_negative(value: float) -> float:
    """A learning rate or a factor of one: NaN, infinity or a negative number would train nothing useful."""
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"must be a finite number >= 0, got {value}")
    return value


def check_url(value: str | None) -> str | None:
    """A storage URL or local path whose scheme Tessera can open (no I/O: the bucket is checked later)."""
    if value is not None:
        try:
            parse_url(value.replace("{run_name}", "run"))
        except StorageError as exc:
            raise ValueError(str(exc)) from None
    return value


class StreamSpec(Strict):
    """One dataset of the mix (tessera.stream.Stream)."""

    remote: str | None = None
    local: str | None = None
    split: str | None = None
    proportion: float | None = None
    repeat: float | None = None
    choose: int | None = None

    _urls = field_validator("remote", "local")(check_url)


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
    max_batches: int | None = Field(default=None, ge=1)
    batch_size: int | None = Field(default=None, ge=1)  # per device; default the training microbatch


class DataSpec(Strict):
    train: LoaderSpec
    eval: EvalSpec | None = None


class OptimizerSpec(Strict):
    name: Literal["decoupled_adamw", "adamw"] = "decoupled_adamw"
    lr: float = 6e-4
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.0

    _non_negative = field_validator("lr", "eps", "weight_decay")(check_non_negative)

    @field_validator("betas")
    @classmethod
    def _betas(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in value):  # also false for NaN
            raise ValueError(f"each beta must be in [0, 1) (e.g. [0.9, 0.95]), got {list(value)}")
        return value


class SchedulerSpec(Strict):
    name: Literal["cosine_with_warmup", "linear_with_warmup", "constant_with_warmup"] = "cosine_with_warmup"
    t_warmup: str = "0ba"
    alpha_f: float = 0.1

    _warmup = field_validator("t_warmup", mode="before")(check_time)
    _alpha_f = field_validator("alpha_f")(check_non_negative)


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
    torch_threads: int | None = Field(default=None, ge=1)

    _times = field_validator("eval_interval", "log_interval", "save_interval", mode="before")(
        lambda v: check_time(v, positive=True))
    _urls = field_validator("save_folder", "load_path")(check_url)

    @field_validator("max_duration", mode="before")
    @classmethod
    def _max_duration(cls, value: Any) -> Any:
        return check_time(value, allow_dur=False)

    @field_validator("run_name")
    @classmethod
    def _run_name(cls, value: str) -> str:
        return check_run_name(value)

    @field_validator("save_num_checkpoints_to_keep")
    @classmethod
    def _keep(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(f"must be >= 1, or null to keep every checkpoint, got {value}")
        return value

    @field_validator("loggers")
    @classmethod
    def _loggers(cls, value: list[str]) -> list[str]:
        for name in value:
            if name not in LOGGERS:
                raise ValueError(f"unknown logger {name!r}; use one of {sorted(LOGGERS)}")
        return value

    @field_validator("grad_clip_norm")
    @classmethod
    def _clip(cls, value: float | None) -> float | None:
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError(f"must be a positive number, or null for no clipping, got {value}")
        return value

    @model_validator(mode="after")
    def _check(self) -> Recipe:
        try:
            GPTConfig.from_dict(dict(self.model))
        except (TypeError, ValueError, ArithmeticError) as exc:
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
    data = _yaml(text, path) or {}
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe is a mapping of keys, got {type(data).__name__}")
    return data


def _yaml(text: str, where: str) -> Any:
    """Plain YAML only: a tag such as `!!python/object` is refused with the line it is on, in one line."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise RecipeError(f"{where}: not valid plain YAML{at}: {problem}") from None
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


def _field_names(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed at `loc` (for did-you-mean)."""
    current: type[BaseModel] | None = model
    for part in loc[:-1]:
        if isinstance(part, int) or current is None:
            continue
        field = current.model_fields.get(part)
        nested = _nested_models(field.annotation) if field else []
        current = nested[0] if nested else None
    return list(current.model_fields) if current is not None else []


def _key_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every key of the schema as a dotted path (list items as index 0), for did-you-mean across sections."""
    paths = []
    for name, field in model.model_fields.items():
        paths.append(f"{prefix}{name}")
        for child in _nested_models(field.annotation)[:1]:
            index = ".0" if get_origin(field.annotation) is list else ""
            paths += _key_paths(child, f"{prefix}{name}{index}.")
    return paths


def _nested_models(annotation: Any) -> list[type[BaseModel]]:
    found = [annotation] if isinstance(annotation, type) and issubclass(annotation, BaseModel) else []
    for arg in getattr(annotation, "__args__", ()):
        found += _nested_models(arg)
    return found


def _did_you_mean(loc: tuple[Any, ...]) -> str:
    """A sibling key spelled alike (`optimizer.lrr`), else a key elsewhere with that name (`lr` -> `optimizer.lr`)."""
    name = str(loc[-1])
    close = difflib.get_close_matches(name, _field_names(Recipe, loc), n=1)
    if close:
        return ".".join([*map(str, loc[:-1]), close[0]])
    paths = _key_paths(Recipe)
    same = [p for p in paths if p.rsplit(".", 1)[-1] == name]
    words = [p for p in paths if name in p.rsplit(".", 1)[-1].split("_")]  # keep -> ..._to_keep
    if same or words:
        return (same or words)[0]
    close = difflib.get_close_matches(name, [p.rsplit(".", 1)[-1] for p in paths], n=1)
    return next((p for p in paths if close and p.rsplit(".", 1)[-1] == close[0]), "")


def _explain(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = ".".join(str(p) for p in loc)
        if err["type"] == "extra_forbidden":
            close = _did_you_mean(loc)
            lines.append(f"unknown key {key!r}" + (f"; did you mean {close!r}?" if close else ""))
        elif err["type"] == "missing":
            lines.append(f"missing key {key!r}")
        elif err["type"] == "value_error":  # our own checks: the message already names the value
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"{key}: {msg}" if key else msg)
        else:
            lines.append(f"{key}: {err['msg']} (got {err.get('input')!r})" if key else err["msg"])
    if len(lines) == 1:
        return f"invalid recipe: {lines[0]}"
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
            raise RecipeError(f"invalid recipe: unknown key 'model.{key}'{hint}")
    try:
        return Recipe.model_validate(tree)
    except ValidationError as exc:
        raise RecipeError(_explain(exc)) from None
