"""A file of named numpy arrays, written atomically and mapped read-only, checked by its checksum.

    prefix: magic, header length, xxh3_64 of everything after the prefix
    header: JSON {name: [offset, dtype, shape]}; arrays at 64-byte aligned offsets after it

For derived data that several processes of a node map (shared epoch plans: stream/plan_files.py; the
packed index, shards/packed_index.py, writes its own header and sections with `write_sections` and
checks them with `open_checked`): a
file that is not whole (bad magic, truncated, a flipped byte) reads as missing, so it is built again
rather than trusted. The checksum is read through the file, not the mapping, so a process's memory holds
only the pages of the arrays it then reads.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import shutil
import struct
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

import numpy as np
import xxhash

from tessera.storage.local import temp_path_for

_PREFIX = struct.Struct("<8sQQ")  # magic, header length, xxh3_64 of everything after the prefix
_ALIGN = 64
_READ = 1 << 20
Writes = Callable[[BinaryIO], object]  # writes one section at the file's position


def aligned(size: int) -> int:
    """`size` rounded up to the alignment of sections (and of the data after the header)."""
    return -(-size // _ALIGN) * _ALIGN


def write_sections(path: Path, magic: bytes, head: bytes, sections: Iterable[tuple[int, Writes]], size: int) -> None:
    """Write `path` atomically: the prefix (`magic`, the header's length, the checksum), the header `head`,
    then `size` bytes of data from the next aligned offset, each section written by its function at its
    offset in the data. The format of every checked file here: arrays (`save`), the packed index."""
    start = aligned(_PREFIX.size + len(head))
    tmp = temp_path_for(path)
    try:
        with open(tmp, "w+b") as out:
            out.write(b"\0" * _PREFIX.size + head)
            for at, write in sections:
                out.seek(start + at)
                write(out)
            out.truncate(start + size)
            out.seek(_PREFIX.size)
            digest = file_digest(out)
            out.seek(0)
            out.write(_PREFIX.pack(magic, len(head), digest))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def copied(source: BinaryIO) -> Writes:
    """Writes a section from the whole of `source` (a temporary file that holds its bytes)."""
    def write(out: BinaryIO) -> None:
        source.seek(0)
        shutil.copyfileobj(source, out, _READ)
    return write


def open_checked(path: Path, magic: bytes) -> tuple[BinaryIO, bytes, int] | None:
    """The file at `path` (written by `write_sections` with `magic`), its header and the offset of its data,
    or None if it is missing or not whole (bad magic, truncated, a flipped byte). The caller closes it."""
    try:
        file = open(path, "rb")  # noqa: SIM115 - returned open
    except OSError:
        return None
    prefix = file.read(_PREFIX.size)
    if len(prefix) == _PREFIX.size:
        found, head_len, digest = _PREFIX.unpack(prefix)
        if found == magic and file_digest(file) == digest:
            file.seek(_PREFIX.size)
            return file, file.read(head_len), aligned(_PREFIX.size + head_len)
    file.close()
    return None


def save(path: Path, arrays: dict[str, np.ndarray], magic: bytes) -> None:
    """Write `arrays` (numbers of any dtype and shape) to `path` atomically, after an 8-byte `magic`."""
    table, at = {}, 0
    for key, value in arrays.items():
        table[key] = [at, value.dtype.str, list(value.shape)]
        at += aligned(value.nbytes)
    path.parent.mkdir(parents=True, exist_ok=True)
    writes = [(table[key][0], lambda out, v=value: out.write(np.ascontiguousarray(v).tobytes()))
              for key, value in arrays.items()]
    write_sections(path, magic, json.dumps(table).encode(), writes, at)


def load(path: Path, magic: bytes) -> dict[str, np.ndarray] | None:
    """The arrays of the file at `path` (written with `magic`), mapped read-only, or None if it is missing
    or not whole."""
    opened = open_checked(path, magic)
    if opened is None:
        return None
    file, head, start = opened
    with file:
        try:
            table = json.loads(head)
        except ValueError:
            return None
        with contextlib.suppress(ValueError):  # (an array past the file's end: not whole)
            mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
            return {key: np.frombuffer(mapping, dtype, int(np.prod(shape)), start + at).reshape(shape)
                    if np.prod(shape) else np.zeros(shape, dtype) for key, (at, dtype, shape) in table.items()}
    return None


def file_digest(file: BinaryIO) -> int:
    """xxh3_64 of the rest of `file` from its position, read in chunks (nothing mapped)."""
    h = xxhash.xxh3_64()
    while chunk := file.read(_READ):
        h.update(chunk)
    return h.intdigest()
