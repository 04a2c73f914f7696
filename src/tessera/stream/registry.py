"""Named Stream classes: `StreamingDataset(..., stream_name=, stream_config=)`, as in MosaicML Streaming.

A project registers a `Stream` subclass under a name (`@streams_registry.register("mine")`, or an entry
point in the group `tessera_streams_registry`); a dataset given `remote=`/`local=` rather than
`streams=[...]` then builds its one stream as `registry[stream_name](**stream_config, remote=...,
local=..., split=..., download_retry=..., download_timeout=..., validate_hash=..., keep_zip=...)`.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from typing import Any

from tessera.stream.streams import Stream

ENTRY_POINT_GROUP = "tessera_streams_registry"

StreamFactory = Callable[..., Stream]


class StreamRegistry:
    """Name -> Stream class (or a function returning a Stream). "stream" is `Stream` itself."""

    def __init__(self) -> None:
        self._items: dict[str, StreamFactory] = {"stream": Stream}

    def register(self, name: str, *, func: StreamFactory | None = None) -> Any:
        """`register("x", func=cls)`, or `@register("x")` on a class or function."""
        if func is not None:
            self._items[name] = func
            return func
        return lambda f: self.register(name, func=f)

    def get(self, name: str) -> StreamFactory:
        if name in self._items:
            return self._items[name]
        for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=name):
            self._items[name] = entry.load()
            return self._items[name]
        raise ValueError(f"stream_name={name!r} is not registered; registered: {sorted(self.get_all())} "
                         "(register a Stream subclass with tessera.stream.streams_registry.register)")

    def get_all(self) -> dict[str, StreamFactory]:
        names = {e.name for e in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)} | set(self._items)
        return {name: self.get(name) for name in names}

    def __contains__(self, name: str) -> bool:
        return name in self._items or bool(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=name))


streams_registry = StreamRegistry()


def build_stream(stream_name: str, stream_config: dict[str, Any] | None, **defaults: Any) -> Stream:
    """The dataset's single stream from the registry; `defaults` (remote, local, ...) win over the config,
    as in MosaicML."""
    made = streams_registry.get(stream_name)(**{**(stream_config or {}), **defaults})
    if not isinstance(made, Stream):
        raise ValueError(f"stream_name={stream_name!r} built a {type(made).__name__}, not a "
                         "tessera.stream.Stream (subclass Stream for a registered stream)")
    return made
