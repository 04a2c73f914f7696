"""`streaming.base.batching.generate_work`."""

from tessera.stream import generate_work

__all__ = ["generate_work"]
