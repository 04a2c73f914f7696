"""`streaming.base.local.LocalDataset(local, split=None)`: Tessera's `MDSDataset` reads a local dataset."""

from tessera.shards import MDSDataset as LocalDataset

__all__ = ["LocalDataset"]
