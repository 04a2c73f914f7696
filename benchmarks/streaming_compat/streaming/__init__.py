"""`import streaming` answered by Tessera, to run MosaicML Streaming's own tests against Tessera.

Each name a test imports maps to Tessera's counterpart (the import a MosaicML user changes when switching,
docs/streaming.md). A name Tessera does not provide is a stand-in that raises `NotImplementedError` when
used, so only the tests that use it fail, not every test of the file that imports it.
"""

from tessera.shards import CSVWriter, JSONWriter, MDSWriter, TSVWriter, XSVWriter
from tessera.stream import Stream, StreamingDataLoader, StreamingDataset

__all__ = ["CSVWriter", "JSONWriter", "MDSWriter", "Stream", "StreamingDataLoader", "StreamingDataset",
           "TSVWriter", "XSVWriter"]
