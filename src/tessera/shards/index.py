"""The model of index.json and of its shard entries, with the validation MDS readers rely on.

MosaicML's reader builds its shard class with `**entry`, so a shard entry must hold exactly the keys of
its format: an extra or missing key crashes it. We therefore refuse such entries on read (naming the
file and shard) and never write one; our own extensions go at the top level of index.json, where
readers ignore unknown keys (we keep them in `DatasetIndex.extensions` so a rewrite preserves them).
Basenames come from untrusted data and are joined to a local root, so absolute ones and ones that climb
out of the root are refused here, before any path is built.

Every number is bounded (`MAX_SAMPLES`, `MAX_BYTES`, `MAX_COLUMN_SIZE`) and every hash name must be one we
can compute: an index from someone's bucket is untrusted input, and `samples: 2**63` would otherwise pass
here and overflow numpy's int64 in the epoch plan, an unknown hash only fail deep in a verify. A sample
count must also fit the shard's recorded size (`max_samples`: each sample takes a 4-byte offset in the
shard's header, or its meta file's), so `samples: 2**31` on a 300-byte shard is refused here, before a
reader sizes anything by it. JSON nested past the interpreter's recursion limit is an IndexFormatError
too, not a RecursionError.

Entries that are each well-formed can still disagree as a whole, and every reader would then serve
wrong data without a word: a file listed by two entries (its samples come twice), or `samples: 0` on a
file that holds samples (they are never read). A file listed twice is refused as soon as its second
entry is parsed, in every mode (an index repeating one entry 50,000 times fails at entry 1, not after
validating them all); `samples: 0` is refused at load too (`inconsistencies`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from tessera.shards.compression import parse_compression
from tessera.shards.errors import IndexFormatError, IndexNotJSON, PathTraversal
from tessera.shards.hashing import is_hash
from tessera.syntax_errors import json_excerpt, json_problem, with_excerpt

INDEX_BASENAME = "index.json"

_FILE_INFO_KEYS = frozenset(["basename", "bytes", "hashes"])
_COMMON_KEYS = frozenset(["compression", "format", "hashes", "raw_data", "samples", "size_limit", "version",
                          "zip_data"])
_SPLIT_KEYS = _COMMON_KEYS | {"raw_meta", "zip_meta", "newline"}
ENTRY_KEYS: dict[str, frozenset[str]] = {
    "mds": _COMMON_KEYS | {"column_encodings", "column_names", "column_sizes"},
    "json": _SPLIT_KEYS | {"columns"},
    "csv": _SPLIT_KEYS | {"column_encodings", "column_names"},
    "tsv": _SPLIT_KEYS | {"column_encodings", "column_names"},
    "xsv": _SPLIT_KEYS | {"column_encodings", "column_names", "separator"},
}
_FILE_KEYS = ("raw_data", "zip_data", "raw_meta", "zip_meta")

MAX_SAMPLES = 2**31 - 1  # per shard: 32-bit offsets cap a shard's bytes at 4 GiB, so real shards hold far fewer
MAX_BYTES = 2**40  # per file and for size_limit (1 TiB); a shard is read whole into the cache
MAX_COLUMN_SIZE = 2**32  # a fixed-size column's bytes per sample
MAX_TOTAL_SAMPLES = 2**62  # the whole index: sample ids and their arithmetic stay inside int64
MAX_DIGEST = 1024  # characters of one recorded digest (sha512 is 128 hex digits)


def check_basename(basename: Any, file: str, shard: int | None = None) -> str:
    """Return `basename` if it is a safe relative path inside the dataset root, else raise.

    Sub-folders are fine (merged datasets use them); absolute paths, drive letters, backslashes and '..'
    components are refused because joining them to the root could read or write outside it.
    """
    if not isinstance(basename, str) or not basename or "\x00" in basename:
        raise IndexFormatError(file, f"shard basename {basename!r} is not a non-empty string", shard)
    path = PurePosixPath(basename)
    if path.is_absolute() or "\\" in basename or re.match(r"^[A-Za-z]:", basename) or ".." in path.parts:
        raise PathTraversal(
            file, f"shard basename {basename!r} is absolute or climbs out of the dataset root (refused)", shard
        )
    if not path.parts or basename.endswith("/"):  # '.', './', 'a/': joined to the root, a folder, not a file
        raise IndexFormatError(file, f"shard basename {basename!r} names a folder, not a shard file", shard)
    return basename


def shard_key(basename: str) -> str:
    """The store key of a validated basename: '/'-separated, '.' segments folded away."""
    return str(PurePosixPath(basename))


class InconsistentIndex(IndexFormatError):
    """index.json's entries disagree as a whole (a file listed twice, a sample count that hides samples)."""


def _fail(file: str, shard: int | None, detail: str) -> IndexFormatError:
    return IndexFormatError(file, detail, shard)


def _count(value: Any, limit: int, file: str, shard: int | None, key: str) -> int:
    """`value` if it is an integer in 0..limit (not a bool, not a float), else the error naming `key`."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= limit:
        raise _fail(file, shard, f"{key} must be an integer from 0 to {limit}, got {_short(value)}")
    return value


def _short(value: Any) -> str:
    """`repr(value)` cut to a readable length (a hostile index can hold megabytes in one value)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _hash_names(names: Any, file: str, shard: int | None, key: str) -> list[str]:
    """Hash algorithm names we can compute; an unknown one is refused here rather than deep in a verify."""
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise _fail(file, shard, f"{key} must be a list of hash algorithm names, got {_short(names)}")
    unknown = [name for name in names if not is_hash(name)]
    if unknown:
        raise _fail(file, shard, f"{key} names unknown hash algorithm(s) {_short(unknown)}; supported: "
                    "blake2b, blake2s, md5, sha1, sha224, sha256, sha384, sha512, sha3_*, xxh32, xxh64, "
                    "xxh128, xxh3_64, xxh3_128")
    return list(names)


@dataclass(frozen=True)
class FileInfo:
    """One stored file of a shard: `{"basename", "bytes", "hashes"}` exactly."""

    basename: str
    bytes: int
    hashes: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"basename": self.basename, "bytes": self.bytes, "hashes": dict(self.hashes)}

    @classmethod
    def from_json(cls, obj: Any, file: str, shard: int | None, key: str) -> FileInfo:
        if not isinstance(obj, dict) or set(obj) != _FILE_INFO_KEYS:
            keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
            raise _fail(file, shard, f"{key} must have exactly the keys basename, bytes, hashes; got {keys}")
        size, hashes = _count(obj["bytes"], MAX_BYTES, file, shard, f"{key}.bytes"), obj["hashes"]
        if not isinstance(hashes, dict) or not all(isinstance(v, str) and len(v) <= MAX_DIGEST
                                                   for v in hashes.values()):
            raise _fail(file, shard, f"{key}.hashes must map algorithm names to hex digests")
        _hash_names(list(hashes), file, shard, f"{key}.hashes")
        return cls(check_basename(obj["basename"], file, shard), size, dict(hashes))


@dataclass(frozen=True)
class ShardEntry:
    """One shard of index.json. MDS entries have the 11 keys of MDS.md; JSON/CSV/TSV/XSV entries have
    their own key sets (a `.meta` file and the text-format settings)."""

    format: str
    samples: int
    raw_data: FileInfo
    zip_data: FileInfo | None
    compression: str | None
    hashes: list[str]
    size_limit: int | None
    column_names: list[str]
    column_encodings: list[str]
    column_sizes: list[int | None]
    version: int = 2
    raw_meta: FileInfo | None = None
    zip_meta: FileInfo | None = None
    newline: str | None = None
    separator: str | None = None

    @property
    def stored(self) -> FileInfo:
        """The file actually stored for the shard's data: the compressed one when compressed."""
        return self.zip_data or self.raw_data

    @property
    def files(self) -> list[FileInfo]:
        """Every file the entry names (data and meta, raw and compressed)."""
        infos = (self.raw_data, self.zip_data, self.raw_meta, self.zip_meta)
        return [info for info in infos if info is not None]

    def empty_size(self) -> int:
        """Bytes of this shard's raw data file when it holds no samples: an MDS shard is then its
        header (count, one offset) and config JSON; a JSON data file is empty, a CSV/TSV/XSV one holds
        its line of column names (MosaicML writes an empty shard when the first sample passes the limit)."""
        if self.format == "json":
            return 0
        if self.format != "mds":
            separator = self.separator or {"csv": ",", "tsv": "\t"}.get(self.format, ",")
            return len((separator.join(self.column_names) + (self.newline or "\n")).encode("utf-8"))
        return 8 + len(json.dumps(self.config(), sort_keys=True).encode())

    def config(self) -> dict[str, Any]:
        """The writer configuration embedded in each MDS shard (the entry without per-shard facts)."""
        obj = self.to_json()
        for key in ("samples", *_FILE_KEYS):
            obj.pop(key, None)
        return obj

    def to_json(self) -> dict[str, Any]:
        """The entry as index.json stores it: exactly the keys of its format."""
        obj: dict[str, Any] = {
            "format": self.format, "samples": self.samples, "raw_data": self.raw_data.to_json(),
            "zip_data": self.zip_data.to_json() if self.zip_data else None, "compression": self.compression,
            "hashes": list(self.hashes), "size_limit": self.size_limit, "version": self.version,
        }
        if self.format == "mds":
            obj.update(column_names=list(self.column_names), column_encodings=list(self.column_encodings),
                       column_sizes=list(self.column_sizes))
            return obj
        obj.update(raw_meta=self.raw_meta.to_json() if self.raw_meta else None,
                   zip_meta=self.zip_meta.to_json() if self.zip_meta else None, newline=self.newline)
        if self.format == "json":
            obj["columns"] = dict(zip(self.column_names, self.column_encodings, strict=True))
            return obj
        obj.update(column_names=list(self.column_names), column_encodings=list(self.column_encodings))
        if self.format == "xsv":
            obj["separator"] = self.separator
        return obj

    @classmethod
    def from_json(cls, obj: Any, file: str, shard: int | None = None) -> ShardEntry:
        """Validate and parse one entry; IndexFormatError (naming file and shard) on any deviation."""
        if not isinstance(obj, dict):
            raise _fail(file, shard, f"shard entry must be an object, got {type(obj).__name__}")
        fmt = obj.get("format")
        if not isinstance(fmt, str) or fmt not in ENTRY_KEYS:
            raise _fail(file, shard, f"unknown shard format {_short(fmt)}; expected one of {sorted(ENTRY_KEYS)}")
        missing, extra = sorted(ENTRY_KEYS[fmt] - set(obj)), sorted(set(obj) - ENTRY_KEYS[fmt])
        if missing or extra:
            raise _fail(file, shard, f"{fmt} shard entry has missing keys {missing} and extra keys {extra}; "
                        "MDS readers need exactly its keys (put extensions at the top level of index.json)")
        if obj["version"] != 2:
            raise _fail(file, shard, f"unsupported version {_short(obj['version'])} (expected 2)")
        samples = _count(obj["samples"], MAX_SAMPLES, file, shard, "samples")
        if obj["compression"] is not None and not isinstance(obj["compression"], str):
            raise _fail(file, shard, f"compression must be a string or null, got {_short(obj['compression'])}")
        for key in ("newline", "separator"):
            if not isinstance(obj.get(key), str | None):
                raise _fail(file, shard, f"{key} must be a string or null, got {_short(obj[key])}")
        try:
            parse_compression(obj["compression"])
        except ValueError as err:
            raise _fail(file, shard, str(err)) from None
        files = {key: FileInfo.from_json(obj[key], file, shard, key) if obj.get(key) is not None else None
                 for key in _FILE_KEYS}
        if files["raw_data"] is None:
            raise _fail(file, shard, "raw_data must describe the shard file")
        _check_fits(samples, files["raw_data"] if fmt == "mds" else files["raw_meta"], file, shard)
        if bool(obj["compression"]) != (files["zip_data"] is not None):
            raise _fail(file, shard, "zip_data must be given exactly when compression is set")
        names, encodings, sizes = _columns(obj, fmt, file, shard)
        hashes = _hash_names(obj["hashes"], file, shard, "hashes")
        size_limit = obj["size_limit"]
        if size_limit is not None:
            size_limit = _count(size_limit, MAX_BYTES, file, shard, "size_limit")
        return cls(format=fmt, samples=samples, raw_data=files["raw_data"], zip_data=files["zip_data"],
                   compression=obj["compression"] or None, hashes=list(hashes), size_limit=size_limit,
                   column_names=names, column_encodings=encodings, column_sizes=sizes,
                   raw_meta=files["raw_meta"], zip_meta=files["zip_meta"], newline=obj.get("newline"),
                   separator=obj.get("separator"))


def _check_fits(samples: int, header: FileInfo | None, file: str, shard: int | None) -> None:
    """`samples` fits the file holding the shard's offsets (the MDS file, a text shard's meta file): a u32
    count, then a u32 offset per sample and one more, so at most (bytes - 8) // 4 samples. Checked before
    any reader sizes arrays or plans by the count; a text entry without a meta file has no such bound."""
    if header is None or samples <= (capacity := max(0, (header.bytes - 8) // 4)):
        return
    raise _fail(file, shard, f"samples is {samples}, but {header.basename!r} of {header.bytes} bytes holds at "
                f"most {capacity} (4 bytes of offset each): the count or the size in index.json is wrong")


def _columns(obj: dict[str, Any], fmt: str, file: str, shard: int | None) -> tuple[list, list, list]:
    """Column names, encodings and fixed sizes of an entry, checked for shape and types."""
    if fmt == "json":
        columns = obj["columns"]
        if not isinstance(columns, dict):
            raise _fail(file, shard, "columns must map column names to encodings")
        names, encodings = list(columns), list(columns.values())
        sizes: list[Any] = [None] * len(names)
    else:
        names, encodings = obj["column_names"], obj["column_encodings"]
        sizes = obj["column_sizes"] if fmt == "mds" else [None] * len(names) if isinstance(names, list) else None
    lists_ok = all(isinstance(x, list) for x in (names, encodings, sizes))
    if not lists_ok or not len(names) == len(encodings) == len(sizes):
        raise _fail(file, shard, "column_names, column_encodings and column_sizes must be lists of one length")
    if not all(isinstance(n, str) for n in names) or not all(isinstance(e, str) for e in encodings):
        raise _fail(file, shard, "column names and encodings must be strings")
    if len(set(names)) != len(names):
        raise _fail(file, shard, f"duplicate column names in {names}")
    for size in sizes:
        if size is not None:
            _count(size, MAX_COLUMN_SIZE, file, shard, "column_sizes")
    return list(names), list(encodings), list(sizes)


@dataclass
class DatasetIndex:
    """index.json: `{"shards": [...], "version": 2}` plus any top-level extensions (kept verbatim)."""

    shards: list[ShardEntry] = field(default_factory=list)
    extensions: dict[str, Any] = field(default_factory=dict)

    @property
    def num_samples(self) -> int:
        return sum(entry.samples for entry in self.shards)

    def to_json(self) -> str:
        """Serialize as MDS writers do: `json.dumps(obj, sort_keys=True)`."""
        obj = {**self.extensions, "shards": [entry.to_json() for entry in self.shards], "version": 2}
        return json.dumps(obj, sort_keys=True)

    def inconsistencies(self, file: str) -> list[InconsistentIndex]:
        """What makes the entries wrong as a whole; each error names `file`, the shard and the basename.
        (A file listed twice never gets this far: `from_json` refuses it at its second entry.)"""
        found = (hidden_samples(entry, shard, file) for shard, entry in enumerate(self.shards))
        return [problem for problem in found if problem is not None]

    @classmethod
    def from_json(cls, text: str | bytes, file: str, *, strict: bool = True) -> DatasetIndex:
        """Parse and validate index.json text; IndexFormatError names `file` (and the shard) on errors.

        `strict=False` accepts entries that are wrong only as a whole (see `inconsistencies`), for tools
        that report every problem of a dataset rather than stop at the first; a file listed twice is
        refused in both modes, at its second entry.
        """
        return cls.from_obj(parse_json(text, file), file, strict=strict)

    @classmethod
    def from_obj(cls, obj: Any, file: str, *, strict: bool = True) -> DatasetIndex:
        """`from_json` of index.json already parsed (`parse_json`): for a caller that keeps the parsed
        entries too (merge.py), so the text is parsed once."""
        if not isinstance(obj, dict) or not isinstance(obj.get("shards"), list):
            raise IndexFormatError(file, 'expected an object with a "shards" list')
        if obj.get("version") != 2:
            raise IndexFormatError(file, f"unsupported index version {_short(obj.get('version'))} (expected 2)")
        shards: list[ShardEntry] = []
        owner: dict[str, int] = {}  # store key -> the first shard naming it
        for i, raw in enumerate(obj["shards"]):
            shards.append(_claim_files(ShardEntry.from_json(raw, file, i), i, owner, file))
        check_total_samples(sum(entry.samples for entry in shards), file)
        extensions = {k: v for k, v in obj.items() if k not in ("shards", "version")}
        index = cls(shards, extensions)
        problems = index.inconsistencies(file) if strict else []
        if problems:
            raise problems[0]
        return index


def parse_json(text: str | bytes, file: str) -> Any:
    """index.json's text parsed, or the IndexFormatError `from_json` raises for text that does not parse."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:  # the line and column, and the line with a caret under it
        raise with_excerpt(IndexNotJSON(file, json_problem(err)).at(err), json_excerpt(err)) from None
    except UnicodeDecodeError as err:
        raise IndexFormatError(file, f"not valid JSON ({err})") from None
    except RecursionError:
        raise IndexFormatError(file, "JSON nested too deeply to be an index (refused)") from None
    return obj


def _claim_files(entry: ShardEntry, shard: int, owner: dict[str, int], file: str) -> ShardEntry:
    """`entry`, once none of its files is one an earlier entry named (recorded in `owner`); else the
    InconsistentIndex naming the file and the first shard that listed it."""
    for info in entry.files:
        first = owner.setdefault(shard_key(info.basename), shard)
        if first != shard:
            raise listed_again(info.basename, first, shard, file)
    return entry


def check_total_samples(total: int, file: str) -> None:
    """Sample ids and their arithmetic stay inside int64: an index of more samples is refused."""
    if total > MAX_TOTAL_SAMPLES:
        raise IndexFormatError(file, f"shards' samples add up to more than {MAX_TOTAL_SAMPLES}")


def listed_again(basename: str, first: int, shard: int, file: str) -> InconsistentIndex:
    """The error of a file that shard `shard` lists after shard `first` did."""
    return InconsistentIndex(file, f"{basename!r} is listed again (first by shard {first}): its samples "
                             "would be read twice; remove the duplicate entry", shard)


def hidden_samples(entry: ShardEntry, shard: int, file: str) -> InconsistentIndex | None:
    """`samples: 0` on a file that holds samples (they would never be read), else None."""
    if entry.samples or entry.raw_data.bytes <= entry.empty_size():
        return None
    return InconsistentIndex(file, f"samples is 0 but {entry.raw_data.basename!r} has "
                             f"{entry.raw_data.bytes} bytes (an empty shard has {entry.empty_size()}): its "
                             "samples would never be read; rebuild the index with `tessera data repair`", shard)
