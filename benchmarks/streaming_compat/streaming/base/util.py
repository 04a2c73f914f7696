"""`streaming.base.util`: the helpers MosaicML's tests use."""

from tessera.stream import clean_stale_shared_memory

__all__ = ["clean_stale_shared_memory"]
