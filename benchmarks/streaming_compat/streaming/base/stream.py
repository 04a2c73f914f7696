"""`streaming.base.stream`: `Stream` and its registry."""

from tessera.stream import Stream, streams_registry

__all__ = ["Stream", "streams_registry"]
