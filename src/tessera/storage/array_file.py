"""A file of named numpy arrays, written atomically and mapped read-only, checked by its checksum.

    prefix: magic, header length, xxh3_64 of everything after the prefix
    header: JSON {name: [offset, dtype, shape]}; arrays at 64-byte aligned offsets after it

For derived data that several processes of a node map (shared epoch plans: stream/plan_files.py): a
file that is not whole (bad magic, truncated, a flipped byte) reads as missing, so it is built again
rather than trusted. The checksum is read through the file, not the mapping, so a process's memory holds
only the pages of the arrays it then reads.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import struct
from pathlib import Path
from typing import BinaryIO

import numpy as np
import xxhash

from tessera.storage.local import temp_path_for

_PREFIX = struct.Struct("<8sQQ")  # magic, header length, xxh3_64 of everything after the prefix
_ALIGN = 64
_READ = 1 << 20


def save(path: Path, arrays: dict[str, np.ndarray], magic: bytes) -> None:
    """Write `arrays` (numbers of any dtype and shape) to `path` atomically, after an 8-byte `magic`."""
    table, at = {}, 0
    for key, value in arrays.items():
        table[key] = [at, value.dtype.str, list(value.shape)]
        at += -(-value.nbytes // _ALIGN) * _ALIGN
    head = json.dumps(table).encode()
    start = -(-(_PREFIX.size + len(head)) // _ALIGN) * _ALIGN
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(path)
    try:
        with open(tmp, "w+b") as out:
            out.write(b"\0" * _PREFIX.size + head)
            for key, value in arrays.items():
                out.seek(start + table[key][0])
                out.write(np.ascontiguousarray(value).tobytes())
            out.truncate(start + at)
            out.seek(_PREFIX.size)
            digest = file_digest(out)
            out.seek(0)
            out.write(_PREFIX.pack(magic, len(head), digest))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load(path: Path, magic: bytes) -> dict[str, np.ndarray] | None:
    """The arrays of the file at `path` (written with `magic`), mapped read-only, or None if it is missing
    or not whole."""
    try:
        file = open(path, "rb")  # noqa: SIM115 - closed below; the mapping outlives it
    except OSError:
        return None
    with file:
        prefix = file.read(_PREFIX.size)
        if len(prefix) != _PREFIX.size:
            return None
        found, head_len, digest = _PREFIX.unpack(prefix)
        if found != magic or file_digest(file) != digest:
            return None
        file.seek(_PREFIX.size)
        try:
            table = json.loads(file.read(head_len))
        except ValueError:
            return None
        with contextlib.suppress(ValueError):  # (an array past the file's end: not whole)
            mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
            start = -(-(_PREFIX.size + head_len) // _ALIGN) * _ALIGN
            return {key: np.frombuffer(mapping, dtype, int(np.prod(shape)), start + at).reshape(shape)
                    if np.prod(shape) else np.zeros(shape, dtype) for key, (at, dtype, shape) in table.items()}
    return None


def file_digest(file: BinaryIO) -> int:
    """xxh3_64 of the rest of `file` from its position, read in chunks (nothing mapped)."""
    h = xxhash.xxh3_64()
    while chunk := file.read(_READ):
        h.update(chunk)
    return h.intdigest()
