"""Tessera: train models on any compute, anywhere, with data and checkpoints in object storage.

Each layer is a package whose `__init__` exports its public names (docs/reference/ lists them):
`tessera.storage`, `tessera.shards`, `tessera.stream`, `tessera.train`, `tessera.llm` and, apart from
them, `tessera.platform`. Importing `tessera` itself loads none of them.
"""

__version__ = "0.1.0"
