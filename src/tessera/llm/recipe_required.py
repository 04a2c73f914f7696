"""Values a recipe leaves for the user: `???` (the marker OmegaConf and Hydra users know) means "must be
set", so a shipped recipe never trains on a placeholder bucket it made up.

Checked after the overrides and before the schema, so one line names every key still unset, each with an
override to copy, instead of a download error from a bucket that was only an example.
"""

from __future__ import annotations

from typing import Any

MUST_SET = "???"

# What an example value looks like, by the key's last part (the rest get VALUE).
_EXAMPLES = {"remote": "s3://bucket/path", "local": "/tmp/cache", "save_folder": "s3://bucket/runs/{run_name}",
             "load_path": "s3://bucket/runs/NAME/checkpoints/latest", "tokenizer": "./tokenizer.json",
             "pretrained": "./hf-model-folder"}


def unset_keys(tree: Any, prefix: str = "", _open: frozenset[int] = frozenset()) -> list[str]:
    """The dotted path of every value that is the `???` marker, in the recipe's order. A YAML alias can
    make a list contain itself (`&a [*a]`); such a cycle is walked once (the schema refuses it later)."""
    if isinstance(tree, (dict, list)) and id(tree) in _open:
        return []
    if isinstance(tree, dict):
        items = ((str(key), value) for key, value in tree.items())
    elif isinstance(tree, list):
        items = ((str(index), value) for index, value in enumerate(tree))
    else:
        return [prefix] if isinstance(tree, str) and tree.strip() == MUST_SET else []
    found: list[str] = []
    for key, value in items:
        found += unset_keys(value, f"{prefix}.{key}" if prefix else key, _open | {id(tree)})
    return found


def must_be_set_message(keys: list[str]) -> str:
    """One line: `k must be set (e.g. k=s3://bucket/path); ...` for each key."""
    return "; ".join(f"{key} must be set (e.g. {key}={_EXAMPLES.get(key.rsplit('.', 1)[-1], 'VALUE')})"
                     for key in keys)


# What stands in for an unset value where nothing is opened (`--print-config`, `--plan`): storage that is
# never touched, the byte tokenizer, a model no path names (--plan then needs model.architecture).
UNSET_MODEL = "unset://model.pretrained"
_PLACEHOLDERS = {"remote": "memory://unset/data", "save_folder": "memory://unset/ckpt",
                 "load_path": "memory://unset/ckpt", "tokenizer": "byte", "pretrained": UNSET_MODEL}


def placeholder_overrides(keys: list[str]) -> list[str]:
    """`key=placeholder` overrides that let a recipe with unset values validate for printing or planning."""
    return [f"{key}={_PLACEHOLDERS.get(key.rsplit('.', 1)[-1], 'unset')}" for key in keys]
