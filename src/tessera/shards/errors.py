"""Errors raised by `tessera.shards`.

Every error about a stored dataset names the file (index or shard) and, when known, the shard number, so
a user looking at a broken dataset of thousands of shards knows where to look and what to do. They are
classes so callers (`tessera data verify`, the streaming layer) can catch one kind and report the rest.
"""

from __future__ import annotations


class ShardError(Exception):
    """Base class of every error raised by `tessera.shards`."""


class ShardFormatError(ShardError, ValueError):
    """A dataset file does not follow the MDS format.

    Args:
        file: the path or URL of the offending file (index.json or a shard).
        detail: what is wrong, and when possible how to fix it.
        shard: the shard's position in index.json, if known.
    """

    def __init__(self, file: str, detail: str, shard: int | None = None) -> None:
        self.file = str(file)
        self.shard = shard
        self.detail = detail
        where = self.file if shard is None else f"{self.file} (shard {shard})"
        super().__init__(f"{where}: {detail}")


class TruncatedShard(ShardFormatError):
    """A shard file is shorter than its header or its index entry says (an interrupted copy)."""


class CorruptShard(ShardFormatError):
    """A shard's offsets or sample headers are inconsistent (out of range, decreasing, wrong sizes)."""


class HashMismatch(ShardFormatError):
    """A shard's bytes do not match the digest recorded in index.json."""


class IndexFormatError(ShardFormatError):
    """index.json (or one of its shard entries) is malformed."""


class PathTraversal(IndexFormatError):
    """A shard basename is absolute or climbs out of the dataset root; reading it could touch any file."""


class UnknownEncoding(ShardFormatError):
    """A column uses an encoding name that is not in the MDS family."""

    def __init__(self, file: str, column: str, encoding: str, shard: int | None = None) -> None:
        self.column = column
        self.encoding = encoding
        super().__init__(file, f"column {column!r} has unknown encoding {encoding!r}", shard)


class UnsafeEncoding(ShardFormatError):
    """A column would be decoded with pickle, which runs arbitrary code from the data."""

    def __init__(self, file: str, column: str, encoding: str, shard: int | None = None) -> None:
        self.column = column
        self.encoding = encoding
        super().__init__(
            file,
            f"column {column!r} uses the unsafe encoding {encoding!r} (pickle executes code from the "
            "data); pass allow_unsafe_types=True only if you trust who wrote this dataset, or select "
            "other columns",
            shard,
        )


class EncodeError(ShardError, ValueError):
    """A value cannot be stored with its column's encoding (wrong type, dtype, shape or range)."""

    def __init__(self, column: str, encoding: str, detail: str) -> None:
        self.column = column
        self.encoding = encoding
        super().__init__(f"column {column!r} ({encoding}): {detail}")


class DatasetNotFound(ShardError, FileNotFoundError):
    """There is no index.json at the given location."""


class DatasetExists(ShardError, FileExistsError):
    """The writer's output already holds a dataset (or an interrupted write) and no mode says what to do."""


class WriterError(ShardError, RuntimeError):
    """The writer failed (for example a background upload failed); nothing new was committed."""
