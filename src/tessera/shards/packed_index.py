"""index.json packed once per node into arrays that every rank and DataLoader worker maps read-only.

A dataset of 500k shards has an index.json of ~190 MB; parsing it into Python objects took every process
seconds and ~1.5 GB. What readers need is a few numbers per shard, so the first process on a node packs
the index into one binary file beside the cache (`index.packed` in the cache's state folder:
storage/state_folder.py; for a local dataset, whose folder is never written to, under the node's temp
dir: `packed_location`, where those of the `KEEP_PACKED` local datasets used last are kept, and none
whose index.json is gone):

    prefix: magic, header length, xxh3_64 of everything after the prefix (storage/array_file.py)
    header: JSON (format, the index's size, stat and xxh64, shard count, layouts, top-level keys, sections)
    sections (64-byte aligned): per shard `samples`, `sample_base` (their running sum), `layout`, and per
    file kind (raw_data, zip_data, raw_meta, zip_meta) its `bytes`, `basename` and digests

A *layout* is what entries share (format, columns, compression, hash names, size limit: everything but the
per-shard values); an entry is rebuilt from its layout's entry and its values only when asked for
(`PackedIndex[i]`, its values read with pread: the mapping's pages hold only what is read in bulk), so
nothing per shard lives in Python objects. Strings of equal length (digests, most
basenames) are a fixed-width block; others are one blob and int64 offsets.

The packed file is written to a temporary name and renamed into place, under an exclusive flock so
that concurrent first openers pack once and the others wait and map it. It is used only if its checksum
holds and its header names index.json as it is now (size, mtime, inode, device); a changed index.json is
packed again, and a damaged packed file (bad magic, truncated, wrong checksum, unreadable header) is
rebuilt, never trusted. Entries are validated while packing exactly as `DatasetIndex.from_json` does
(index_bulk.py reads well-formed indexes in bulk and falls back to it otherwise), so a bad index.json
still fails with the same error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import json
import mmap
import os
import struct
import tempfile
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import xxhash

from tessera.shards.errors import IndexFormatError
from tessera.shards.index import _FILE_KEYS, DatasetIndex, FileInfo, ShardEntry
from tessera.shards.index_bulk import scan
from tessera.shards.index_template import Block, Irregular, Template, value_fields
from tessera.storage.array_file import aligned, copied, open_checked, write_sections
from tessera.storage.locks import flocked
from tessera.storage.state_folder import state_folder
from tessera.storage.temp_folders import node_root, prune, touch

MAGIC = b"TSPACK02"  # 02: storage/array_file.py's prefix (no file length: the checksum covers it)
FORMAT = 2  # 2: the first shard of each layout in the header; entries read with pread
PACKED_NAME = "index.packed"
SOURCE_NAME = "source"  # beside a packed index under the temp dir: the path of its index.json
KEEP_PACKED = 32  # packed indexes of local datasets kept under the temp dir (the most recently used)
_READ = 1 << 20
_BLOCK = 16384  # entries per block when packing from parsed entries
_CACHED_ENTRIES = 4096


def _layout_key(entry: ShardEntry) -> str:
    """What entries of one layout share: the entry with its per-shard values blanked (hash names kept)."""
    blank = {"samples": 0}
    for key in _FILE_KEYS:
        info = getattr(entry, key)
        if info is not None:
            blank[key] = FileInfo("-", 0, dict.fromkeys(info.hashes, ""))
    return json.dumps([dataclasses.replace(entry, **blank).to_json(), value_fields(entry)], sort_keys=True)


class _Writer:
    """Columns appended a block at a time to anonymous temporary files (so packing holds one block in
    memory), then laid out into the packed file."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.rows = 0
        self.numbers: dict[str, BinaryIO] = {}
        self.texts: dict[str, tuple[BinaryIO, BinaryIO, list[int]]] = {}  # blob, lengths, [min, max] length
        self.layouts: list[ShardEntry] = []
        self.firsts: dict[int, int] = {}  # layout -> its first shard
        self._keys: dict[str, int] = {}

    def layout_id(self, entry: ShardEntry) -> int:
        key = _layout_key(entry)
        if key not in self._keys:
            self._keys[key] = len(self.layouts)
            self.layouts.append(entry)
        return self._keys[key]

    def _temp(self) -> BinaryIO:
        return tempfile.TemporaryFile(dir=self.folder)  # type: ignore[return-value]

    def add(self, layout: np.ndarray, numbers: dict[str, np.ndarray],
            strings: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        n = layout.size
        for k in np.unique(layout).tolist():
            self.firsts.setdefault(k, self.rows + int(np.argmax(layout == k)))
        numbers = {"layout": layout.astype(np.int64), **numbers}
        for name in sorted(numbers.keys() - self.numbers.keys()):  # (one order: the same bytes every time)
            self.numbers[name] = self._temp()
            self.numbers[name].write(np.full(self.rows, -1, np.int64).tobytes())
        for name in sorted(strings.keys() - self.texts.keys()):
            lengths = self._temp()
            lengths.write(np.zeros(self.rows, np.int64).tobytes())
            self.texts[name] = (self._temp(), lengths, [0 if self.rows else 1 << 62, 0])
        for name, file in self.numbers.items():
            file.write(np.ascontiguousarray(numbers.get(name, np.full(n, -1, np.int64)), np.int64).tobytes())
        for name, (blob_file, length_file, span) in self.texts.items():
            blob, lengths = strings.get(name, (np.zeros(0, np.uint8), np.zeros(n, np.int64)))
            blob_file.write(blob.tobytes())
            length_file.write(np.ascontiguousarray(lengths, np.int64).tobytes())
            if n:
                span[0], span[1] = min(span[0], int(lengths.min())), max(span[1], int(lengths.max()))
        self.rows += n

    def finish(self, dest: Path, header: dict[str, Any]) -> None:
        for name in ("layout", "samples"):  # an index of no shards still has them, with no rows
            if name not in self.numbers:
                self.numbers[name] = self._temp()
        sections: list[tuple[str, BinaryIO, str, list[int]]] = []
        for name, file in self.numbers.items():
            sections.append((name, file, "<i8", [self.rows]))
        sections.append(("sample_base", self._running_sum(self.numbers["samples"]), "<i8", [self.rows + 1]))
        strings = {}
        for name, (blob, lengths, (low, high)) in self.texts.items():
            if self.rows and low == high:
                strings[name] = {"width": low}
                sections.append((name, blob, "|u1", [self.rows * low]))
            else:
                strings[name] = {"offsets": name + "@offsets"}
                sections.append((name, blob, "|u1", [blob.seek(0, os.SEEK_END)]))
                sections.append((name + "@offsets", self._running_sum(lengths), "<i8", [self.rows + 1]))
        table, at = {}, 0
        for name, file, dtype, shape in sections:
            size = file.seek(0, os.SEEK_END)
            table[name] = [at, size, dtype, shape]
            at += aligned(size)
        head = json.dumps({**header, "format": FORMAT, "shards": self.rows, "sections": table, "strings": strings,
                           "layouts": [entry.to_json() for entry in self.layouts],
                           "firsts": [self.firsts.get(k, 0) for k in range(len(self.layouts))]}).encode()
        copies = [(table[name][0], copied(file)) for name, file, _, _ in sections]
        try:
            write_sections(dest, MAGIC, head, copies, at)
        finally:
            for _, file, _, _ in sections:
                file.close()

    def _running_sum(self, values: BinaryIO) -> BinaryIO:
        """A new temp file holding 0 and the running sum of an int64 column (offsets, sample_base)."""
        out, carry = self._temp(), 0
        out.write(np.zeros(1, np.int64).tobytes())
        values.seek(0)
        while chunk := values.read(_READ):
            sums = np.cumsum(np.frombuffer(chunk, np.int64)) + carry
            out.write(sums.tobytes())
            carry = int(sums[-1])
        return out


def _stat_key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev]


def pack(index: Path, dest: Path, label: str) -> None:
    """Pack `index` (index.json) into `dest`; IndexFormatError as `DatasetIndex.from_json` raises it."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(index, "rb") as file:
        st = os.fstat(file.fileno())
        writer, hasher = _Writer(dest.parent), xxhash.xxh64()
        template_layouts: list[int] = []

        def emit(block: Block, templates: list[Template]) -> None:
            template_layouts.extend(writer.layout_id(t.entry) for t in templates[len(template_layouts):])
            writer.add(np.asarray(template_layouts, np.int64)[block.layout], block.numbers, block.strings)

        try:
            top = scan(file, label, emit, hasher)
        except Irregular:
            file.seek(0)
            text = file.read()
            hasher = xxhash.xxh64(text)
            parsed = DatasetIndex.from_json(text, label)  # the exact errors of the loader
            del text
            writer = _Writer(dest.parent)
            for lo in range(0, len(parsed.shards), _BLOCK):
                _add_entries(writer, parsed.shards[lo:lo + _BLOCK])
            top = {**parsed.extensions}
            del parsed
    top.pop("shards", None)
    header = {"index": {"stat": _stat_key(st), "xxh64": hasher.hexdigest()}, "top": top}
    writer.finish(dest, header)


def _add_entries(writer: _Writer, entries: Sequence[ShardEntry]) -> None:
    """Append parsed entries (the fallback path) as one block."""
    n = len(entries)
    layout = np.array([writer.layout_id(e) for e in entries], np.int64)
    numbers = {"samples": np.array([e.samples for e in entries], np.int64)}
    texts: dict[str, list[bytes]] = {}
    for i, entry in enumerate(entries):
        for key in _FILE_KEYS:
            info = getattr(entry, key)
            if info is None:
                continue
            numbers.setdefault(f"{key}.bytes", np.full(n, -1, np.int64))[i] = info.bytes
            texts.setdefault(f"{key}.basename", [b""] * n)[i] = info.basename.encode()
            for algo, digest in info.hashes.items():
                texts.setdefault(f"{key}.hashes.{algo}", [b""] * n)[i] = digest.encode()
    strings = {name: (np.frombuffer(b"".join(v), np.uint8), np.array([len(x) for x in v], np.int64))
               for name, v in texts.items()}
    writer.add(layout, numbers, strings)


class PackedIndex(Sequence[ShardEntry]):
    """A packed index mapped read-only: per-shard arrays, and entries rebuilt on demand (a few cached)."""

    def __init__(self, path: Path, index: Path, label: str, file: BinaryIO, mapping: mmap.mmap,
                 header: dict[str, Any], start: int) -> None:
        self.path, self.index_path, self.label = path, index, label
        self._file, self._map, self._start = file, mapping, start
        self._firsts: list[int] = header["firsts"]
        self.fingerprint: str = header["index"]["xxh64"]
        self.extensions: dict[str, Any] = {k: v for k, v in header["top"].items() if k != "version"}
        self._sections: dict[str, list] = header["sections"]
        self._strings: dict[str, dict[str, Any]] = header["strings"]
        self.layouts = [ShardEntry.from_json(obj, label) for obj in header["layouts"]]
        self._count = int(header["shards"])
        self.samples = self.array("samples")
        self.sample_base = self.array("sample_base")
        self._entries: OrderedDict[int, ShardEntry] = OrderedDict()

    @property
    def layout_ids(self) -> np.ndarray:
        """The layout of each shard (an index into `layouts`)."""
        return self.array("layout")

    def array(self, name: str) -> np.ndarray:
        """A read-only view of one section (int64 numbers or bytes)."""
        offset, size, dtype, shape = self._sections[name]
        count = size // np.dtype(dtype).itemsize
        return np.frombuffer(self._map, dtype, count, self._start + offset).reshape(shape)

    def bytes_of(self, key: str) -> np.ndarray | None:
        """Bytes of file kind `key` ("raw_data", "zip_data", ...) per shard, -1 where a shard has none."""
        return self.array(f"{key}.bytes") if f"{key}.bytes" in self._sections else None

    @functools.cached_property
    def largest_shard(self) -> int:
        """The most bytes one shard takes in a cache (raw + compressed, while it is decompressed)."""
        total, zipped = self.bytes_of("raw_data"), self.bytes_of("zip_data")
        return int((total if zipped is None else total + np.maximum(zipped, 0)).max(initial=0))

    def _read(self, name: str, at: int, size: int) -> bytes:
        """`size` bytes of section `name` from byte `at`, read with pread: the values of one entry are
        read, not mapped (a mapped page fault maps a whole folio of the file into this process)."""
        return os.pread(self._file.fileno(), size, self._start + self._sections[name][0] + at)

    def _number(self, name: str, shard: int) -> int:
        return int.from_bytes(self._read(name, 8 * shard, 8), "little", signed=True)

    def text(self, name: str, shard: int) -> str:
        spec = self._strings[name]
        if "width" in spec:
            w = spec["width"]
            return self._read(name, shard * w, w).decode()
        lo, hi = struct.unpack("<qq", self._read(spec["offsets"], 8 * shard, 16))
        return self._read(name, lo, hi - lo).decode()

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, at: Any) -> Any:
        if isinstance(at, slice):
            return [self._entry(i) for i in range(*at.indices(self._count))]
        i = int(at)
        if i < 0:
            i += self._count
        if not 0 <= i < self._count:
            raise IndexError(f"shard {at} is out of range for an index of {self._count} shards")
        return self._entry(i)

    def __iter__(self) -> Iterator[ShardEntry]:
        return (self._entry(i) for i in range(self._count))

    def _entry(self, i: int) -> ShardEntry:
        hit = self._entries.get(i)
        if hit is not None:
            return hit
        layout = self.layouts[self._number("layout", i)]
        files = {}
        for key in _FILE_KEYS:
            info = getattr(layout, key)
            if info is not None:
                files[key] = FileInfo(self.text(f"{key}.basename", i), self._number(f"{key}.bytes", i),
                                      {a: self.text(f"{key}.hashes.{a}", i) for a in info.hashes})
        entry = dataclasses.replace(layout, samples=self._number("samples", i), **files)
        self._entries[i] = entry
        if len(self._entries) > _CACHED_ENTRIES:
            self._entries.popitem(last=False)
        return entry

    def layout_shards(self) -> list[tuple[int, ShardEntry]]:
        """(first shard, its entry) of every layout, in shard order: what per-layout checks look at."""
        return sorted((shard, self[shard]) for shard in self._firsts)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled as where it is (a worker maps the same file), never as its arrays."""
        return _reopen, (str(self.index_path), self.label, self.fingerprint, self.path == packed_beside(self.index_path))


def _reopen(index: str, label: str, fingerprint: str, beside: bool) -> PackedIndex:
    packed = open_packed(Path(index), label, beside)
    if packed.fingerprint != fingerprint:
        raise IndexFormatError(label, "index.json changed while the dataset was in use (its packed form no "
                               "longer matches); build the dataset again")
    return packed


def packed_beside(index: Path) -> Path:
    """The packed form of a cache folder's index.json: in the folder's state folder, beside the folder."""
    return state_folder(index.parent) / PACKED_NAME


def packed_location(index: Path, beside: bool) -> Path:
    """Where the packed form of `index` lives: with `beside` (a cache folder of downloaded shards)
    `packed_beside`, if it can be written; else (a dataset folder, which is never written to, or a
    read-only cache) a folder per index under the system temp dir of this node."""
    local = packed_beside(index)
    with contextlib.suppress(OSError):
        if beside:
            local.parent.mkdir(parents=True, exist_ok=True)
            if os.access(local.parent, os.W_OK):
                return local
    digest = hashlib.sha1(str(index.resolve()).encode()).hexdigest()[:16]
    return node_root("packed") / digest / PACKED_NAME


def _index_gone(folder: Path) -> bool:
    """Whether the index.json a temp-dir folder of a packed index was made for no longer exists."""
    try:
        return not Path((folder / SOURCE_NAME).read_text()).exists()
    except OSError:
        return False  # (being made: its source is written first thing; else the recency rule decides)


def _load(path: Path, st: os.stat_result, index: Path, label: str) -> PackedIndex | None:
    """The packed file at `path` if it is whole and describes index.json as `st` says it is now."""
    opened = open_checked(path, MAGIC)
    if opened is None:
        return None
    file, head, start = opened
    with file:  # (the mapping outlives it)
        try:
            header = json.loads(head)
        except ValueError:
            return None
        if header.get("format") != FORMAT or header["index"]["stat"] != _stat_key(st):
            return None
        mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        kept = os.fdopen(os.dup(file.fileno()), "rb")  # (the same file as mapped, for pread)
        return PackedIndex(path, index, label, kept, mapping, header, start)


def open_packed(index: Path, label: str, beside: bool = False) -> PackedIndex:
    """The packed form of `index` (index.json), packing it first when there is none that matches it
    (`packed_location` says where, `beside` as there).

    FileNotFoundError if `index` does not exist; IndexFormatError (naming `label`) if it is invalid.
    """
    dest = packed_location(index, beside)
    in_temp = dest.parent.parent == node_root("packed")
    if in_temp:
        touch(dest.parent)  # (in use: kept by `prune`)
    found = _load(dest, os.stat(index), index, label)
    if found is not None:
        return found
    dest.parent.mkdir(parents=True, exist_ok=True)
    with flocked(dest.with_name(dest.name + ".lock"), fcntl.LOCK_EX):
        found = _load(dest, os.stat(index), index, label)  # packed by another process meanwhile
        if found is None:
            if in_temp:  # the temp dir holds the packed indexes of the last KEEP_PACKED local datasets used
                (dest.parent / SOURCE_NAME).write_text(str(index.resolve()))
                prune(dest.parent.parent, KEEP_PACKED, stale=_index_gone, spare=dest.parent)
            pack(index, dest, label)
            found = _load(dest, os.stat(index), index, label)
    if found is None:
        raise IndexFormatError(label, f"index.json changed while it was being packed into {dest}; try again")
    return found
