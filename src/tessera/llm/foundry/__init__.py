"""LLM Foundry's train YAML, read unchanged: `tessera train mpt-125m.yaml variables.data_local=./c4`.

A MosaicML user's YAML (the files under llm-foundry's scripts/train/yamls) is recognised by its keys
(`train_loader`, `variables`, a `tokenizer: {name: ...}` mapping, `model.name: mpt_causal_lm`...), read as
Foundry reads it (resolve.py: dotted overrides merged first, then `${variables.x}` resolved with
OmegaConf), and translated key by key (translate.py and the modules it calls) into a Tessera recipe tree,
which llm/recipe.py then validates like any recipe: the translation is not a second config system, and
`tessera train FILE --print-config` or `tessera recipe convert FILE` show the recipe it became.

What Foundry does that Tessera does differently but with the same maths gives a warning (a flash
kernel, an initialization scheme, a callback whose metric is logged anyway); what Tessera cannot do is
refused before anything starts, in one line naming the key (`errors.py`). docs/foundry.md lists both.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from tessera.llm.foundry.errors import FoundryError, FoundryWarning
from tessera.llm.foundry.resolve import anchored_keys, is_foundry, resolved
from tessera.llm.foundry.translate import KNOWN_KEYS, recipe_tree

__all__ = ["FoundryError", "FoundryWarning", "foundry_recipe", "is_foundry"]


def foundry_recipe(tree: dict[str, Any], overrides: list[str] | tuple[str, ...], path: str) -> dict[str, Any]:
    """The Tessera recipe tree of a Foundry train YAML (`tree`, parsed from `path`) with Foundry-style
    overrides; FoundryError (one line naming the key) when it cannot be trained as Foundry would.

    A top-level key that only holds a YAML anchor merged elsewhere (`dataset: &hf_dataset {...}`, which
    older Foundry ignored and newer Foundry refuses) is dropped with a warning."""
    holders = anchored_keys(Path(path).read_text(encoding="utf-8")) if Path(path).is_file() else set()
    for key in sorted(holders & set(tree) - KNOWN_KEYS):
        warnings.warn(f"{key}: not a key of LLM Foundry's train YAML; it holds a YAML anchor (merged where it "
                      "is used) and is ignored", FoundryWarning, stacklevel=2)
        tree = {k: v for k, v in tree.items() if k != key}
    return recipe_tree(resolved(tree, overrides))
