"""Parquet row groups whose rows all encode to the same number of bytes, encoded with numpy, not per row.

The common case of a token dataset (one binary or fixed-width column per sample) then costs one copy of
the row group instead of a Python object per value (`to_pylist`) and a call per sample. The bytes are
exactly those of `SampleEncoder.encode` on each row:

- a binary column is stored as it is, whatever its encoding (a `bytes` value is pre-encoded input), so a
  fixed-size encoding needs every value to have its size;
- a string column under `str` is its UTF-8 bytes, which Arrow already holds;
- a numeric column under the scalar encoding of the same dtype (`int` is int64) is its little-endian values.

Anything else (nulls, values of varying lengths, other types) returns None and the caller encodes per row,
which also produces the precise error message for bad values. The choice depends only on the chunk's
contents, so the dataset stays byte-identical for any number of workers.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from tessera.shards.encodings import FixedEncoding, lookup_encoding
from tessera.shards.samples import ColumnWriter, SampleEncoder


def encode_uniform_rows(table: Any, encoder: SampleEncoder) -> tuple[np.ndarray, np.ndarray] | None:
    """(sizes, body) of every row of an Arrow table, or None when rows differ in size or need Python."""
    rows = table.num_rows
    if rows == 0 or sys.byteorder != "little":
        return None
    blocks: list[tuple[bool, np.ndarray]] = []  # (has a u32 size in the sample header, (rows, width) bytes)
    for col in encoder.columns:
        if col.name not in table.column_names:
            return None
        block = _column_bytes(table.column(col.name).combine_chunks(), col, rows)
        if block is None:
            return None
        blocks.append((col.size is None, block))
    variable = [block.shape[1] for var, block in blocks if var]
    width = 4 * len(variable) + sum(block.shape[1] for _, block in blocks)
    if len(blocks) == 1 and not variable:
        body = blocks[0][1].reshape(-1)  # the Arrow buffer itself, no copy
    else:
        out = np.empty((rows, width), dtype=np.uint8)
        out[:, :4 * len(variable)] = np.array(variable, dtype="<u4").view(np.uint8)  # same sizes on every row
        position = 4 * len(variable)
        for _, block in blocks:
            out[:, position:position + block.shape[1]] = block
            position += block.shape[1]
        body = out.reshape(-1)
    return np.full(rows, width, dtype=np.uint32), body


def _column_bytes(array: Any, col: ColumnWriter, rows: int) -> np.ndarray | None:
    """The column's encoded values as a (rows, width) uint8 array, or None."""
    import pyarrow as pa

    if array.null_count:
        return None
    kind = array.type
    buffers = array.buffers()
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or (
            col.encoding == "str" and (pa.types.is_string(kind) or pa.types.is_large_string(kind))):
        index = np.int64 if pa.types.is_large_binary(kind) or pa.types.is_large_string(kind) else np.int32
        offsets = np.frombuffer(buffers[1], dtype=index)[array.offset:array.offset + rows + 1]
        lengths = np.diff(offsets)
        width = int(lengths[0])
        if (lengths != width).any() or (col.size is not None and width != col.size):
            return None
        if width == 0:
            return np.empty((rows, 0), dtype=np.uint8)
        data = np.frombuffer(buffers[2], dtype=np.uint8)[int(offsets[0]):int(offsets[-1])]
        return data.reshape(rows, width)
    encoding = lookup_encoding(col.encoding)
    if not (isinstance(encoding, FixedEncoding) and encoding.shape == () and encoding.size
            and (pa.types.is_integer(kind) or pa.types.is_floating(kind))):
        return None
    dtype = np.dtype(kind.to_pandas_dtype())
    if dtype.newbyteorder("<") != encoding.dtype:
        return None
    values = np.frombuffer(buffers[1], dtype=dtype)[array.offset:array.offset + rows]
    return values.view(np.uint8).reshape(rows, dtype.itemsize)
