"""Errors raised by `tessera.shards`.

Every error about a stored dataset names the file (index or shard) and, when known, the shard number, so
a user looking at a broken dataset of thousands of shards knows where to look and what to do. They are
classes so callers (`tessera data verify`, the streaming layer) can catch one kind and report the rest.

Each class also derives from the built-in exception MosaicML Streaming raises for the same case (a
checksum failure is a ValueError there, a missing index a FileNotFoundError, an unknown encoding a
TypeError, a sample without a column a KeyError), so `except` clauses written for Mosaic still catch
ours. Every class can be rebuilt from its message alone, which is how torch's DataLoader re-raises a
worker's exception in the training process: the class (and so those `except` clauses) survives.
"""

from __future__ import annotations

import json
import re
from typing import Any, Self

from tessera.storage.errors import IntegrityError


def _rebuild(cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]) -> BaseException:
    err = cls(*args)
    err.__dict__.update(state)
    return err


class ShardError(Exception):
    """Base class of every error raised by `tessera.shards`."""

    # The message as given: KeyError would show it quoted, OSError as "[Errno ...]".
    __str__ = BaseException.__str__

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle by message and attributes (subclasses take other arguments than their message)."""
        return _rebuild, (type(self), self.args, self.__dict__)


class ShardFormatError(ShardError, ValueError):
    """A dataset file does not follow the MDS format.

    Args:
        file: the path or URL of the offending file (index.json or a shard); alone, the whole message.
        detail: what is wrong, and when possible how to fix it.
        shard: the shard's position in index.json, if known.
    """

    def __init__(self, file: str, detail: str | None = None, shard: int | None = None) -> None:
        self.file = str(file) if detail is not None else ""
        self.shard = shard
        self.detail = detail if detail is not None else str(file)
        where = self.file if shard is None else f"{self.file} (shard {shard})"
        super().__init__(f"{where}: {detail}" if detail is not None else self.detail)


class TruncatedShard(ShardFormatError):
    """A shard file is shorter than its header or its index entry says (an interrupted copy)."""


class CorruptShard(ShardFormatError):
    """A shard's offsets or sample headers are inconsistent (out of range, decreasing, wrong sizes)."""


class HashMismatch(ShardFormatError, IntegrityError):
    """A shard's bytes do not match the digest recorded in index.json (Mosaic: ValueError); an
    IntegrityError wherever it is found, as a storage-level hash check is."""


class MissingShard(ShardFormatError, FileNotFoundError):
    """A file that index.json names is not there (Mosaic: FileNotFoundError)."""


class IndexFormatError(ShardFormatError):
    """index.json (or one of its shard entries) is malformed."""


class _JSONDecodeError(json.JSONDecodeError):
    """`json.JSONDecodeError` built from a message alone, as every error here is (`ShardError.__reduce__`);
    `at` gives it the position of the error it stands for."""

    def __init__(self, message: str) -> None:
        ValueError.__init__(self, message)
        self.msg, self.doc, self.pos, self.lineno, self.colno = message, "", 0, 1, 1

    def at(self, err: json.JSONDecodeError) -> Self:
        """This error, at `err`'s position (its `doc`, the whole index text, is not kept)."""
        self.msg, self.pos, self.lineno, self.colno = err.msg, err.pos, err.lineno, err.colno
        return self


class IndexNotJSON(IndexFormatError, _JSONDecodeError):
    """index.json does not parse: empty, cut short or corrupted (MosaicML: `json.JSONDecodeError`). The
    message is Tessera's for every file that does not parse: the file, the problem, line and column."""


class EmptyIndex(IndexFormatError, RuntimeError):
    """index.json lists no sample (no shard, or only empty ones): nothing to stream. MosaicML: RuntimeError
    ("Stream contains no samples")."""


class PathTraversal(IndexFormatError):
    """A shard basename is absolute or climbs out of the dataset root; reading it could touch any file."""


class ColumnEncodingError(ShardFormatError):
    """A column's encoding cannot be used. Built from (file, column, encoding, shard); from the message
    alone (the form pickling across DataLoader workers rebuilds it with), `column` is None."""

    def __init__(self, file: str, column: str | None = None, encoding: str | None = None,
                 shard: int | None = None) -> None:
        self.column, self.encoding = column, encoding
        if column is None:
            super().__init__(file)
            return
        super().__init__(file, self.describe(column, encoding), shard)

    @staticmethod
    def describe(column: str, encoding: str | None) -> str:
        raise NotImplementedError


class UnknownEncoding(ColumnEncodingError, TypeError, KeyError):
    """A column uses an encoding name that is not in the MDS family (Mosaic: TypeError from its writer,
    KeyError from its reader)."""

    @staticmethod
    def describe(column: str, encoding: str | None) -> str:
        return f"column {column!r} has unknown encoding {encoding!r}"


class UnsafeEncoding(ColumnEncodingError):
    """A column would be decoded with pickle, which runs arbitrary code from the data."""

    @staticmethod
    def describe(column: str, encoding: str | None) -> str:
        return (f"column {column!r} uses the unsafe encoding {encoding!r} (pickle executes code from the "
                "data); pass allow_unsafe_types=True only if you trust who wrote this dataset, or select "
                "other columns")


class EncodeError(ShardError, ValueError):
    """A value cannot be stored with its column's encoding (out of range, wrong dtype or shape).

    Args:
        column: the column; alone, the whole message.
        encoding: the column's encoding.
        detail: what is wrong with the value.
    """

    def __init__(self, column: str, encoding: str | None = None, detail: str | None = None) -> None:
        self.column = column if encoding is not None else ""
        self.encoding = encoding
        super().__init__(f"column {column!r} ({encoding}): {detail}" if encoding is not None else column)


class EncodeTypeError(EncodeError, TypeError, AttributeError):
    """A value has the wrong type for its column (Mosaic: AttributeError from its type checks)."""


class ColumnMismatch(EncodeError, KeyError):
    """A sample does not match the writer's columns: one is missing, or a pre-encoded value has the wrong
    size for its fixed-size column (Mosaic: KeyError for both)."""


class DatasetNotFound(ShardError, FileNotFoundError):
    """There is no index.json at the given location (Mosaic: FileNotFoundError)."""


class DatasetExists(ShardError, FileExistsError):
    """The writer's output already holds a dataset (or an interrupted write) and no mode says what to do."""

    def for_cli(self) -> str:
        """The message with the Python spelling of an option (`mode='append'`, `overwrite=True`) replaced by
        `tessera data`'s (`--mode append`, `--overwrite`); the message alone must rebuild the error, so the
        CLI spelling is derived from it, not stored."""
        return re.sub(r"mode='(\w+)'", r"--mode \1", str(self)).replace("overwrite=True", "--overwrite")

    def for_overwrite_only(self) -> str:
        """For a command whose only choice is `--overwrite` (`tessera llm prep`): what is there, and that flag."""
        return str(self).split("; pass ", 1)[0] + "; pass --overwrite to replace it"


class WriterError(ShardError, RuntimeError):
    """The writer failed (for example a background upload failed); nothing new was committed."""
