"""`streaming.base.world.World`."""

from tessera.stream.world import World

__all__ = ["World"]
