"""MDS column encodings: how one column value becomes bytes in a sample, and back.

The byte layouts are fixed by the MDS format (see MDS.md); what is ours is the shape of the code:

- Each encoding is an object with `encode(value) -> bytes` and `decode_at(buf, offset, size)`, which reads
  straight out of a memory-mapped shard. Fixed-size numeric encodings (`int`, `uint16`, ...,
  `ndarray:DTYPE:SHAPE`) decode with `np.frombuffer` on the mapping, so a static ndarray comes back as a
  read-only view with no copy, and they expose `dtype`/`shape` so a reader can stack a whole batch of
  them with one gather instead of building per-sample objects.
- Encodings are parsed once per column (`get_encoding` is cached), not once per value.
- A value that is already `bytes` is stored as-is whatever the encoding (pre-encoded input), as MDS does.
"""

from __future__ import annotations

import json
import pickle
import struct
from decimal import Decimal
from functools import lru_cache
from numbers import Integral
from typing import Any

import numpy as np

# (Buffer and Encoding are also imported from here by readers and writers.)
from tessera.shards.column_encoding import Buffer as Buffer
from tessera.shards.column_encoding import Encoding as Encoding


class FixedEncoding(Encoding):
    """An encoding whose values are numpy data. When `size` is set (the scalars, `int` and
    `ndarray:DTYPE:SHAPE`) every value has this `dtype` and `shape`, so a batch stacks into one array.

    `dtype` is always little-endian, as MDS stores it; `shape` is () for scalars.
    """

    dtype: np.dtype
    shape: tuple[int, ...] = ()


class BytesEncoding(Encoding):
    name = "bytes"

    def encode(self, value: Any) -> bytes:
        if isinstance(value, bytearray | memoryview):
            return bytes(value)
        raise TypeError(f"expected bytes, got {type(value).__name__}")

    def decode_at(self, buf: Any, offset: int, size: int) -> bytes:
        return bytes(buf[offset : offset + size])


class StrEncoding(Encoding):
    name = "str"

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, str):
            raise TypeError(f"expected str, got {type(value).__name__}")
        return value.encode("utf-8")

    def decode_at(self, buf: Any, offset: int, size: int) -> str:
        return str(buf[offset : offset + size], "utf-8")


class IntEncoding(FixedEncoding):
    """`int`: a Python int stored as int64; decodes to a Python int (not a numpy scalar)."""

    name = "int"
    size = 8
    dtype = np.dtype("<i8")
    _struct = struct.Struct("<q")

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, Integral):
            raise TypeError(f"expected an int, got {type(value).__name__}")
        try:
            return self._struct.pack(int(value))
        except struct.error as err:
            raise ValueError(f"{value} does not fit in int64") from err

    def decode_at(self, buf: Any, offset: int, size: int) -> int:
        return self._struct.unpack_from(buf, offset)[0]


class ScalarEncoding(FixedEncoding):
    """`int8` ... `float64`: one numpy scalar, little-endian; decodes to a numpy scalar."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.dtype = np.dtype(name).newbyteorder("<")
        self.size = self.dtype.itemsize
        self._type = self.dtype.type

    def encode(self, value: Any) -> bytes:
        # Same conversion as MDS (numpy's constructor), so identical input gives identical bytes.
        return self._type(value).tobytes()

    def decode_at(self, buf: Any, offset: int, size: int) -> Any:
        return np.frombuffer(buf, self.dtype, 1, offset)[0]


class StrNumberEncoding(Encoding):
    """`str_int`, `str_float`, `str_decimal`: `str(value)` as UTF-8, exact at any precision."""

    def __init__(self, name: str, kind: type) -> None:
        self.name = name
        self._kind = kind

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, self._kind) or (self._kind is int and isinstance(value, bool)):
            raise TypeError(f"expected {self._kind.__name__}, got {type(value).__name__}")
        return str(value).encode("utf-8")

    def decode_at(self, buf: Any, offset: int, size: int) -> Any:
        return self._kind(str(buf[offset : offset + size], "utf-8"))


class JSONEncoding(Encoding):
    name = "json"

    def encode(self, value: Any) -> bytes:
        if isinstance(value, np.ndarray):
            value = value.tolist()
        return json.dumps(value).encode("utf-8")

    def decode_at(self, buf: Any, offset: int, size: int) -> Any:
        return json.loads(buf[offset : offset + size])


class PickleEncoding(Encoding):
    """`pkl`: arbitrary objects. Unsafe: readers refuse it unless the user opts in."""

    name = "pkl"
    safe = False

    def encode(self, value: Any) -> bytes:
        return pickle.dumps(value)

    def decode_at(self, buf: Any, offset: int, size: int) -> Any:
        return pickle.loads(buf[offset : offset + size])


# ndarray dtype codes and shape codes, fixed by the format.
NDARRAY_DTYPE_CODES = {
    "uint8": 8, "int8": 9, "uint16": 16, "int16": 17, "float16": 18, "uint32": 32, "int32": 33,
    "float32": 34, "uint64": 64, "int64": 65, "float64": 66,
}
_CODE_TO_DTYPE = {code: np.dtype(name).newbyteorder("<") for name, code in NDARRAY_DTYPE_CODES.items()}
_SHAPE_DTYPES = [np.dtype("<u1"), np.dtype("<u2"), np.dtype("<u4"), np.dtype("<u8")]


class NDArrayEncoding(FixedEncoding):
    """`ndarray[:DTYPE[:D1,D2,...]]`: stores only the parts the encoding name leaves dynamic.

    With both dtype and shape static the column is fixed-size and decodes as a zero-copy view.
    """

    def __init__(self, name: str, dtype: str | None, shape: tuple[int, ...] | None) -> None:
        self.name = name
        self.dtype = np.dtype(dtype).newbyteorder("<") if dtype else None  # type: ignore[assignment]
        self.static_shape = shape
        self.shape = shape or ()
        self.size = None
        self._count = 0
        if self.dtype is not None and shape is not None:
            self._count = int(np.prod(shape))
            self.size = self._count * self.dtype.itemsize

    def encode(self, value: Any) -> bytes:
        return bytes(self.encode_view(value))

    def encode_view(self, value: Any) -> memoryview | bytes:
        """Like `encode`, but without copying a static C-contiguous array: the writer appends the view."""
        if self.size is not None and isinstance(value, np.ndarray) and value.dtype == self.dtype \
                and value.shape == self.static_shape:
            try:
                return memoryview(value).cast("B")  # the hot path of token datasets: no copy, no checks left
            except TypeError:
                return value.tobytes()  # not C-contiguous
        return self._encode_checked(value)

    def _encode_checked(self, value: Any) -> bytes:
        if not isinstance(value, np.ndarray):
            raise TypeError(f"expected a numpy array, got {type(value).__name__}")
        name = value.dtype.name
        code = NDARRAY_DTYPE_CODES.get(name)
        if code is None:
            raise TypeError(f"unsupported dtype {name}; MDS stores {sorted(NDARRAY_DTYPE_CODES)}")
        if self.dtype is not None and name != self.dtype.name:
            raise TypeError(f"expected dtype {self.dtype.name}, got {name}")
        if value.ndim == 0 or value.size == 0:
            raise ValueError(f"cannot store an array of shape {value.shape}: empty and 0-d arrays are refused")
        if self.static_shape is not None and value.shape != self.static_shape:
            raise ValueError(f"expected shape {self.static_shape}, got {value.shape}")
        if value.dtype.byteorder == ">":
            value = value.astype(value.dtype.newbyteorder("<"))
        head = b"" if self.dtype is not None else bytes([code])
        if self.static_shape is None:
            head += self._shape_header(value.shape)
        return head + value.tobytes()

    @staticmethod
    def _shape_header(shape: tuple[int, ...]) -> bytes:
        if len(shape) > 63:
            raise ValueError(f"too many dimensions ({len(shape)}); MDS stores at most 63")
        biggest = max(shape)
        code = 0 if biggest < 1 << 8 else 1 if biggest < 1 << 16 else 2 if biggest < 1 << 32 else 3
        return bytes([(len(shape) << 2) | code]) + np.array(shape, _SHAPE_DTYPES[code]).tobytes()

    def decode_at(self, buf: Any, offset: int, size: int) -> np.ndarray:
        if self.size is not None:
            return np.frombuffer(buf, self.dtype, self._count, offset).reshape(self.static_shape)
        end = offset + size
        dtype = self.dtype
        if dtype is None:
            dtype = _CODE_TO_DTYPE.get(buf[offset])
            if dtype is None:
                raise ValueError(f"unknown ndarray dtype code {buf[offset]}")
            offset += 1
        shape = self.static_shape
        if shape is None:
            head = buf[offset]
            ndim, shape_dtype = head >> 2, _SHAPE_DTYPES[head & 3]
            shape = tuple(np.frombuffer(buf, shape_dtype, ndim, offset + 1).tolist())
            offset += 1 + ndim * shape_dtype.itemsize
        count = int(np.prod(shape))
        if offset + count * dtype.itemsize != end:
            raise ValueError(f"ndarray of shape {shape} and dtype {dtype.name} does not fill its {size} bytes")
        return np.frombuffer(buf, dtype, count, offset).reshape(shape)


_SCALARS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
            "float16", "float32", "float64")


def _parse_ndarray(name: str, config: str | None) -> NDArrayEncoding | None:
    """Parse the part after `ndarray:`; None when it is not a valid dtype/shape spec."""
    parts = config.split(":") if config else []
    if len(parts) > 2 or (parts and parts[0] not in NDARRAY_DTYPE_CODES):
        return None
    dtype = parts[0] if parts else None
    shape = None
    if len(parts) == 2:
        try:
            shape = tuple(int(dim) for dim in parts[1].split(","))
        except ValueError:
            return None
        if not shape or min(shape) < 1:
            return None
    return NDArrayEncoding(name, dtype, shape)


@lru_cache(maxsize=256)
def lookup_encoding(name: str) -> Encoding | None:
    """The encoding object for an MDS encoding name, or None if the name is not one (cached)."""
    if not isinstance(name, str):
        return None
    base, sep, config = name.partition(":")
    if base == "ndarray":
        return _parse_ndarray(name, config if sep else None)
    if sep:
        return None
    if name in _SCALARS:
        return ScalarEncoding(name)
    simple: dict[str, Any] = {
        "bytes": BytesEncoding, "str": StrEncoding, "int": IntEncoding, "json": JSONEncoding,
        "pkl": PickleEncoding,
        "str_int": lambda: StrNumberEncoding("str_int", int),
        "str_float": lambda: StrNumberEncoding("str_float", float),
        "str_decimal": lambda: StrNumberEncoding("str_decimal", Decimal),
    }
    if name in simple:
        return simple[name]()
    from tessera.shards import image_encodings  # images need PIL (~0.15 s to import): only for them

    return image_encodings.lookup(name)


def get_encoding(name: str) -> Encoding:
    """The encoding object for `name`; ValueError naming the encoding when unknown."""
    encoding = lookup_encoding(name)
    if encoding is None:
        raise ValueError(f"unknown MDS encoding {name!r}; known: {', '.join(sorted(ENCODING_NAMES))}")
    return encoding


def is_encoding(name: str) -> bool:
    """Whether `name` is a valid MDS encoding (including `ndarray:DTYPE:SHAPE` forms)."""
    return lookup_encoding(name) is not None


def encoding_size(name: str) -> int | None:
    """The fixed byte size of values of this encoding, or None when variable."""
    return get_encoding(name).size


def is_safe(name: str) -> bool:
    """False for encodings whose decoding can run arbitrary code (pickle)."""
    encoding = lookup_encoding(name)
    return encoding is None or encoding.safe


def encode_value(encoding: Encoding, value: Any) -> bytes:
    """Encode with the pre-encoded-bytes passthrough MDS applies to every encoding."""
    if isinstance(value, bytes):
        return value
    return encoding.encode(value)


ENCODING_NAMES = frozenset(
    ["bytes", "str", "int", "json", "pkl", "str_int", "str_float", "str_decimal", "ndarray", *_SCALARS,
     "pil", "jpeg", "png", "list[pil]", "list[jpeg]", "list[png]", "jpeg_array", "jpegarray"]
)
