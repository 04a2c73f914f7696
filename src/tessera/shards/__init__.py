"""How samples become bytes: MDS shards, written, read, converted, verified and repaired.

Byte-compatible with MosaicML Streaming's MDS format both ways. Main entry points:

- `ShardWriter(out, columns, ...)`: write a dataset to a folder or any storage URL, committed atomically.
- `MDSWriter`, `JSONWriter`, `CSVWriter`, `TSVWriter`, `XSVWriter`: MosaicML's writers' signatures and bytes.
- `MDSDataset(url, ...)`: random access over a local or remote dataset (`len`, `ds[i]`, `get_batch`).
- `ShardReader(path, entry)`, `TextShardReader(path, meta, entry)`: one shard file; `read_index(store)`
  and `DatasetIndex` / `ShardEntry`: the dataset's index.json.
- `tessera.shards.convert.convert(input, out)`: JSONL, Parquet, CSV/TSV, text or images to MDS, in
  parallel (`tessera data convert`). It stays in its module: a function named `convert` here would hide
  the module of the same name.
- `verify_dataset(url)`: check every file against the index; `repair_index(url)`: rebuild a lost
  index.json from the shard files; `merge_index(out)`: one index.json over parts written in parallel.
- `MDSDatasink(out, columns)`: a Ray Data sink (`ds.write_datasink(...)`) writing parts and one merged index;
  imported on first use, so Ray is only needed by those who use it.
- Errors derive from `ShardError`; malformed files raise a `ShardFormatError` naming the file.
"""

from tessera.lazy_exports import lazy_exports
from tessera.shards.dataset import MDSDataset, read_index
from tessera.shards.errors import (
    ColumnMismatch,
    CorruptShard,
    DatasetExists,
    DatasetNotFound,
    EmptyIndex,
    EncodeError,
    EncodeTypeError,
    HashMismatch,
    IndexFormatError,
    IndexNotJSON,
    MissingShard,
    PathTraversal,
    ShardError,
    ShardFormatError,
    TruncatedShard,
    UnknownEncoding,
    UnsafeEncoding,
    WriterError,
)
from tessera.shards.index import DatasetIndex, ShardEntry
from tessera.shards.merge import merge_index
from tessera.shards.reader import ShardReader
from tessera.shards.repair import repair_index
from tessera.shards.text_reader import TextShardReader
from tessera.shards.text_writer import CSVWriter, JSONWriter, TSVWriter, XSVWriter
from tessera.shards.verify import verify_dataset
from tessera.shards.writer import MDSWriter, ShardWriter

__all__ = [
    "CSVWriter", "ColumnMismatch", "CorruptShard", "DatasetExists", "DatasetIndex", "DatasetNotFound", "EmptyIndex",
    "EncodeError", "EncodeTypeError", "HashMismatch", "IndexFormatError", "IndexNotJSON", "JSONWriter", "MDSDataset",
    "MDSWriter", "MissingShard", "PathTraversal", "ShardEntry", "ShardError", "ShardFormatError",
    "ShardReader", "ShardWriter", "TSVWriter", "TextShardReader", "TruncatedShard", "UnknownEncoding",
    "UnsafeEncoding", "WriterError", "XSVWriter", "merge_index", "read_index", "repair_index", "verify_dataset",
]

__getattr__ = lazy_exports(__name__, {"ray_datasink": ["MDSDatasink"]})  # needs Ray (the `ray` extra)
