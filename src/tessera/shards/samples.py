"""`SampleEncoder`: one sample dict -> its MDS bytes (size header of the variable columns, then payloads).

Shared by `ShardWriter.write` and the worker processes of `convert`, so a sample encodes to the same
bytes wherever it is encoded: that is what makes a parallel conversion byte-identical to a serial one.
Each column's encoder is resolved once, not once per sample.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tessera.shards.encodings import Encoding, NDArrayEncoding, lookup_encoding
from tessera.shards.errors import ColumnMismatch, EncodeError, EncodeTypeError, UnknownEncoding


@dataclass(frozen=True)
class ColumnWriter:
    """One column's encoder, resolved once: `size` is its fixed byte size or None (variable)."""

    name: str
    encoding: str
    size: int | None
    encode: Callable[[Any], Any]


def column_writer(name: str, encoding_name: str, label: str) -> ColumnWriter:
    encoding: Encoding | None = lookup_encoding(encoding_name)
    if encoding is None:
        raise UnknownEncoding(label, name, encoding_name)
    encode = encoding.encode_view if isinstance(encoding, NDArrayEncoding) else encoding.encode
    return ColumnWriter(name, encoding_name, encoding.size, encode)


class SampleEncoder:
    """Encodes samples of fixed columns (sorted by name, as MDS orders them)."""

    def __init__(self, columns: Mapping[str, str], label: str) -> None:
        if not columns:
            raise ValueError("columns must name at least one column, e.g. {'text': 'str'}")
        self.columns = [column_writer(name, columns[name], label) for name in sorted(columns)]
        self._var_header = struct.Struct(f"<{sum(col.size is None for col in self.columns)}I")

    def encode(self, sample: Mapping[str, Any]) -> tuple[list[Any], int]:
        """The byte parts of one sample (size header first) and their total length."""
        parts: list[Any] = [b""]
        sizes = []
        total = 0
        for col in self.columns:
            try:
                value = sample[col.name]
                datum = value if isinstance(value, bytes) else col.encode(value)
            except KeyError:
                raise ColumnMismatch(col.name, col.encoding, "missing from the sample") from None
            except EncodeError:
                raise
            except (TypeError, AttributeError) as err:
                raise EncodeTypeError(col.name, col.encoding, str(err)) from None
            except Exception as err:  # encoders raise ValueError/OverflowError/PIL errors
                raise EncodeError(col.name, col.encoding, str(err)) from None
            size = len(datum)
            if col.size is None:
                sizes.append(size)
            elif size != col.size:
                raise ColumnMismatch(col.name, col.encoding, f"encoded to {size} bytes, expected {col.size}")
            parts.append(datum)
            total += size
        if sizes:
            parts[0] = self._var_header.pack(*sizes)
            total += len(parts[0])
        return parts, total
