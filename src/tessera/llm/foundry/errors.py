"""How the translation of an LLM Foundry YAML speaks: one refusal (`FoundryError`) or warnings.

A refusal is one line naming the Foundry key, its value when that helps, and why Tessera cannot do
it; the recipe loader (llm/recipe.py) prefixes the file. A warning says what Tessera does instead
where the maths of training is the same (a kernel, an initialization scheme, a callback whose
metric Tessera logs anyway), so nothing changes silently.
"""

from __future__ import annotations

import warnings
from typing import Any


class FoundryError(ValueError):
    """A key of the Foundry YAML that Tessera cannot honour; the message is one line naming it."""


class FoundryWarning(UserWarning):
    """A key Tessera honours differently (the same maths, another kernel or default)."""


def warn(message: str) -> None:
    warnings.warn(message, FoundryWarning, stacklevel=2)


def refuse(key: str, why: str, value: Any = None) -> FoundryError:
    shown = f"={value}" if value is not None and not isinstance(value, (dict, list)) else ""
    return FoundryError(f"{key}{shown}: {why}")


def section(tree: Any, key: str) -> dict[str, Any]:
    """A mapping of the YAML (an absent or null one is empty); anything else is refused."""
    if tree is None:
        return {}
    if not isinstance(tree, dict):
        raise refuse(key, f"must be a mapping, got {type(tree).__name__}")
    return tree


def unknown(key: str, names: Any, known: Any) -> None:
    """Refuse the first of `names` that is not in `known` (the keys a Foundry section may hold here)."""
    for name in names:
        if name not in known:
            raise refuse(f"{key}.{name}", f"not a key Tessera knows for LLM Foundry's {key} (known: "
                                          f"{', '.join(sorted(known))})")
