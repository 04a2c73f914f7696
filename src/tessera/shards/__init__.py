"""How samples become bytes: MDS encodings, compression, hashing, the index model, writer and readers.

Byte-compatible with MosaicML Streaming's MDS format both ways (see MDS.md). Main entry points:

- `ShardWriter(out, columns, ...)`: write a dataset to a folder or any storage URL, committed atomically.
- `MDSDataset(url, ...)`: random access over a local or remote dataset (`len`, `ds[i]`, `get_batch`).
- `ShardReader(path, entry)`: one shard file, memory-mapped.
- `repair_index(url)`: rebuild a lost index.json from the shard files.
- `merge_index(out)`: one index.json over parts written in parallel (MosaicML's merge_index).
- `MDSWriter`, `JSONWriter`, `CSVWriter`, `TSVWriter`, `XSVWriter`: MosaicML's writers' signatures and bytes.
"""

from tessera.shards.compression import Compression, parse_compression, valid_compressions
from tessera.shards.dataset import MDSDataset, read_index
from tessera.shards.encodings import (
    ENCODING_NAMES,
    Encoding,
    FixedEncoding,
    encoding_size,
    get_encoding,
    is_encoding,
    is_safe,
)
from tessera.shards.errors import (
    ColumnMismatch,
    CorruptShard,
    DatasetExists,
    DatasetNotFound,
    EncodeError,
    EncodeTypeError,
    HashMismatch,
    IndexFormatError,
    MissingShard,
    PathTraversal,
    ShardError,
    ShardFormatError,
    TruncatedShard,
    UnknownEncoding,
    UnsafeEncoding,
    WriterError,
)
from tessera.shards.hashing import HASH_ALGORITHMS, hash_hex, is_hash
from tessera.shards.index import INDEX_BASENAME, DatasetIndex, FileInfo, ShardEntry
from tessera.shards.merge import merge_index
from tessera.shards.reader import ShardReader
from tessera.shards.repair import repair_index
from tessera.shards.sizes import parse_count, parse_size
from tessera.shards.text_reader import TextShardReader
from tessera.shards.text_writer import CSVWriter, JSONWriter, TSVWriter, XSVWriter
from tessera.shards.writer import MDSWriter, ShardWriter

__all__ = [
    "CSVWriter", "ColumnMismatch", "EncodeTypeError", "JSONWriter", "MDSWriter", "MissingShard", "TSVWriter",
    "XSVWriter", "merge_index", "parse_count",
    "ENCODING_NAMES", "HASH_ALGORITHMS", "INDEX_BASENAME", "Compression", "CorruptShard", "DatasetExists",
    "DatasetIndex", "DatasetNotFound", "EncodeError", "Encoding", "FileInfo", "FixedEncoding", "HashMismatch",
    "IndexFormatError", "MDSDataset", "PathTraversal", "ShardEntry", "ShardError", "ShardFormatError",
    "ShardReader", "ShardWriter", "TextShardReader", "TruncatedShard", "UnknownEncoding", "UnsafeEncoding",
    "WriterError", "encoding_size", "get_encoding", "hash_hex", "is_encoding", "is_hash", "is_safe",
    "parse_compression", "parse_size", "read_index", "repair_index", "valid_compressions",
]
