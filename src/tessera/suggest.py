"""Did-you-mean: the one place that picks which known name a misspelt one was meant to be, and words it.

Every layer refuses unknown keys (a recipe's, a run spec's, a logger's, a model config's, a Trainer
setting) with the same suggestion, so the cutoff and the wording live here, at the package's top level,
which imports nothing of Tessera: storage, shards, stream, train, llm, the platform and the CLI may all
import it without bending the layers.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

CUTOFF = 0.6  # difflib's default: `lrr` -> `lr`, `max_seq_lne` -> `max_seq_len`, `foo` -> nothing


def closest(word: str, known: Iterable[str], cutoff: float = CUTOFF) -> str | None:
    """The known name spelled most like `word`, or None when none is close enough."""
    matches = difflib.get_close_matches(str(word), [str(k) for k in known], n=1, cutoff=cutoff)
    return matches[0] if matches else None


def meant(name: str) -> str:
    """The wording of a suggestion already chosen (`did you mean 'optimizer.lr'?`)."""
    return f"did you mean {name!r}?"


def did_you_mean(word: str, known: Iterable[str], *, prefix: str = "", list_known: bool = False) -> str:
    """`did you mean 'PREFIXname'?` for the closest known name (`prefix` qualifies it: `model.`); when
    none is close, `known keys: a, b, c` if `list_known`, else an empty string. No separator: the caller
    joins it (`hint(...)` adds the usual `; `)."""
    names = [str(k) for k in known]
    match = closest(word, names)
    if match is not None:
        return meant(prefix + match)
    return f"known keys: {', '.join(names)}" if list_known and names else ""


def hint(word: str, known: Iterable[str], *, prefix: str = "", list_known: bool = False) -> str:
    """`did_you_mean` after `; `, ready to append to an error message (empty when there is nothing to say)."""
    text = did_you_mean(word, known, prefix=prefix, list_known=list_known)
    return f"; {text}" if text else ""
