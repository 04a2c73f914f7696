"""`import streaming` answered by Tessera, to run MosaicML Streaming's own tests against Tessera.

Each name a test imports maps to Tessera's counterpart (the import a MosaicML user changes when switching,
docs/streaming.md); `streaming.base.local.LocalDataset` is Tessera's `MDSDataset`.
"""

from tessera.shards import CSVWriter, JSONWriter, MDSWriter, TSVWriter, XSVWriter
from tessera.stream import Stream, StreamingDataLoader, StreamingDataset

__all__ = ["CSVWriter", "JSONWriter", "MDSWriter", "Stream", "StreamingDataLoader", "StreamingDataset",
           "TSVWriter", "XSVWriter"]
