"""Names a package exports but imports on first use: a module `__getattr__` (PEP 562) made from a table.

Used where importing every name at once would cost what a user of one name does not need: torch for
`tessera.train`'s time units and `tessera.llm`'s tokenizers, Ray for `tessera.shards.MDSDatasink`. The
package keeps a literal `__all__` and the same names under `if TYPE_CHECKING:` for tools that read it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_exports(package: str, modules: Mapping[str, Sequence[str]]) -> Callable[[str], Any]:
    """A `__getattr__` for `package` that loads each name of `modules` ({module below the package:
    [names]}) from its module when first asked for."""
    home = {name: f"{package}.{module}" for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in home:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(home[name]), name)

    return __getattr__
