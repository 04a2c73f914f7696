"""`streaming.base`: the same names as `streaming`."""

from streaming import (
    CSVWriter,
    JSONWriter,
    MDSWriter,
    Stream,
    StreamingDataLoader,
    StreamingDataset,
    TSVWriter,
    XSVWriter,
)

__all__ = ["CSVWriter", "JSONWriter", "MDSWriter", "Stream", "StreamingDataLoader", "StreamingDataset",
           "TSVWriter", "XSVWriter"]
