"""Stand-ins for MosaicML names Tessera does not provide: importing them works, using them fails."""

from collections.abc import Callable
from typing import Any


def missing(name: str) -> Callable[..., Any]:
    """A callable that raises `NotImplementedError` naming `name`."""

    def stand_in(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{name} has no Tessera counterpart")

    stand_in.__name__ = name
    return stand_in
