"""A recipe's keys, read from its schema: the table of `tessera train --list-keys` and the did-you-mean
of an unknown key.

Kept apart from the recipe's models and loading (recipe.py) because both walk the same pydantic schema
the same way (sections expanded, list items as index N or 0), and nothing here decides what a valid
recipe is: the schema is passed in (`Recipe`), so the listing and the hints can never drift from it.
"""

from __future__ import annotations

import json
import types
from dataclasses import fields
from enum import Enum
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

from tessera.llm.hf.config import PretrainedSpec
from tessera.llm.model import NAMED_CONFIGS, GPTConfig
from tessera.suggest import closest
from tessera.train.logger_settings import LOGGERS
from tessera.train.time import Time


def _type_name(annotation: Any) -> str:
    """A key's type as a recipe writer reads it: `time | null`, `fp32 | amp_bf16 | amp_fp16`, `list[str]`."""
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is Literal:
        return " | ".join(str(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin in (list, tuple):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in args if a is not Ellipsis)}]"
    if origin is dict:
        return "mapping"
    if annotation is Time:
        return "time"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " | ".join(str(m.value) for m in annotation)
    return getattr(annotation, "__name__", str(annotation))


def recipe_keys(schema: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) of every key of `schema` (the `Recipe`), sections expanded."""
    rows = []
    for name, info in schema.model_fields.items():
        if not prefix and name == "model":  # a mapping that GPTConfig checks: its keys are GPTConfig's
            rows.append(("model.name", "str", "tiny", f"A named shape ({', '.join(NAMED_CONFIGS)}) that sets "
                                                      "the keys below; a key given overrides it."))
            rows += [(f"model.{f.name}", str(f.type), _shown(f.default), f.metadata.get("help", ""))
                     for f in fields(GPTConfig)]
            rows += [row for row in recipe_keys(PretrainedSpec, "model.") if row[0] != "model.max_seq_len"]
            continue
        if name == "loggers":  # names, or a mapping of a name to its settings: each logger's keys
            rows.append(("loggers", "list[str | Logger] | mapping", "[progress]", info.description or ""))
            for logger, settings in LOGGERS.items():
                rows += recipe_keys(settings, f"{prefix}loggers.{logger}.")
            continue
        nested = nested_models(info.annotation)
        if nested:
            index = ".N" if get_origin(info.annotation) is list else ""
            rows += recipe_keys(nested[0], f"{prefix}{name}{index}.")
            continue
        default = "required" if info.is_required() else _shown(info.get_default(call_default_factory=True))
        rows.append((f"{prefix}{name}", _type_name(info.annotation), default, info.description or ""))
    return rows


def _shown(value: Any) -> str:
    """A default as a recipe would write it: `10ba`, `null`, `[progress]`."""
    if isinstance(value, str):
        return value
    return json.dumps(value, default=lambda v: getattr(v, "value", str(v))).replace('"', "")


def _field_names(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed at `loc` (for did-you-mean)."""
    current: type[BaseModel] | None = model
    for part in loc[:-1]:
        if isinstance(part, int) or current is None:
            continue
        field = current.model_fields.get(part)
        nested = nested_models(field.annotation) if field else []
        current = nested[0] if nested else None
    return list(current.model_fields) if current is not None else []


def key_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every key of the schema as a dotted path (list items as index 0), for did-you-mean across sections."""
    paths = []
    for name, field in model.model_fields.items():
        paths.append(f"{prefix}{name}")
        for child in nested_models(field.annotation)[:1]:
            index = ".0" if get_origin(field.annotation) is list else ""
            paths += key_paths(child, f"{prefix}{name}{index}.")
    return paths


def nested_models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models a field's annotation holds (a section, a list of them, an optional one)."""
    found = [annotation] if isinstance(annotation, type) and issubclass(annotation, BaseModel) else []
    for arg in getattr(annotation, "__args__", ()):
        found += nested_models(arg)
    return found


def did_you_mean(schema: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """A key elsewhere with exactly that name (`lr` -> `optimizer.lr`, not the sibling `lora`), else a sibling
    spelled alike (`optimizer.lrr`), else a key elsewhere whose name holds it or is spelled alike."""
    name = str(loc[-1])
    paths = key_paths(schema)
    same = [p for p in paths if p.rsplit(".", 1)[-1] == name]
    close = closest(name, _field_names(schema, loc))
    if close and not same:
        return ".".join([*map(str, loc[:-1]), close])
    words = [p for p in paths if name in p.rsplit(".", 1)[-1].split("_")]  # keep -> ..._to_keep
    if same or words:
        return (same or words)[0]
    close = closest(name, [p.rsplit(".", 1)[-1] for p in paths])
    return next((p for p in paths if close and p.rsplit(".", 1)[-1] == close), "")
