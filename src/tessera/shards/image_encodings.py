"""Image encodings of MDS: `pil`, `jpeg`, `png`, their `list[...]` forms and `jpeg_array`.

Kept apart from the numeric encodings so that reading token shards never imports PIL. Layouts follow
MDS.md; JPEG input that came from a JPEG file is stored with the file's original bytes (no re-encoding
loss, and byte-identical to MosaicML's writer), anything else is saved at PIL's default quality 75.
"""

from __future__ import annotations

import io
import struct
from typing import Any

import numpy as np
from PIL import Image
from PIL.JpegImagePlugin import JpegImageFile

from tessera.shards.column_encoding import Encoding

_U32 = struct.Struct("<I")


def _require_image(value: Any) -> Image.Image:
    if not isinstance(value, Image.Image):
        raise TypeError(f"expected a PIL image, got {type(value).__name__}")
    return value


class PILEncoding(Encoding):
    """`pil`: u32 width, u32 height, u32 len(mode), mode, raw pixels: lossless and fast to decode."""

    name = "pil"

    def encode(self, value: Any) -> bytes:
        image = _require_image(value)
        mode = image.mode.encode("utf-8")
        width, height = image.size
        return struct.pack("<III", width, height, len(mode)) + mode + image.tobytes()

    def decode_at(self, buf: Any, offset: int, size: int) -> Image.Image:
        width, height, mode_size = struct.unpack_from("<III", buf, offset)
        start = offset + 12
        mode = str(buf[start : start + mode_size], "utf-8")
        raw = bytes(buf[start + mode_size : offset + size])
        return Image.frombytes(mode, (width, height), raw)


class JPEGEncoding(Encoding):
    name = "jpeg"

    def encode(self, value: Any) -> bytes:
        image = _require_image(value)
        filename = getattr(image, "filename", None)
        if isinstance(image, JpegImageFile) and filename:
            try:
                with open(filename, "rb") as file:
                    return file.read()
            except OSError:
                pass  # the source file is gone: fall back to re-encoding the pixels
        out = io.BytesIO()
        image.save(out, format="JPEG")
        return out.getvalue()

    def decode_at(self, buf: Any, offset: int, size: int) -> Image.Image:
        return Image.open(io.BytesIO(bytes(buf[offset : offset + size])))


class PNGEncoding(Encoding):
    name = "png"

    def encode(self, value: Any) -> bytes:
        out = io.BytesIO()
        _require_image(value).save(out, format="PNG")
        return out.getvalue()

    def decode_at(self, buf: Any, offset: int, size: int) -> Image.Image:
        return Image.open(io.BytesIO(bytes(buf[offset : offset + size])))


def _element_spans(buf: Any, start: int, count: int) -> list[tuple[int, int]]:
    """(offset, size) of `count` elements whose u32 sizes start at `start`, data right after them."""
    sizes = np.frombuffer(buf, "<u4", count, start).tolist()
    position = start + 4 * count
    spans = []
    for size in sizes:
        spans.append((position, size))
        position += size
    return spans


class ImageListEncoding(Encoding):
    """`list[pil]`, `list[jpeg]`, `list[png]`: u32 0 (reserved), u32 count, count u32 sizes, elements."""

    def __init__(self, name: str, element: Encoding) -> None:
        self.name = name
        self.element = element

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, list | tuple):
            raise TypeError(f"expected a list of images, got {type(value).__name__}")
        parts = [item if isinstance(item, bytes) else self.element.encode(item) for item in value]
        sizes = np.array([len(part) for part in parts], "<u4").tobytes()
        return b"".join([_U32.pack(0), _U32.pack(len(parts)), sizes, *parts])

    def decode_at(self, buf: Any, offset: int, size: int) -> list[Image.Image]:
        (count,) = _U32.unpack_from(buf, offset + 4)
        spans = _element_spans(buf, offset + 8, count)
        if spans and spans[-1][0] + spans[-1][1] != offset + size:
            raise ValueError(f"list of {count} images does not fill its {size} bytes")
        return [self.element.decode_at(buf, start, length) for start, length in spans]


class JPEGArrayEncoding(Encoding):
    """`jpeg_array` / `jpegarray`: u32 count, count u32 sizes, then JPEG files already encoded."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._jpeg = JPEGEncoding()

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, list | tuple):
            raise TypeError(f"expected a list of JPEG bytes, got {type(value).__name__}")
        parts = [bytes(item) if isinstance(item, bytes | bytearray | memoryview) else self._jpeg.encode(item)
                 for item in value]
        sizes = np.array([len(part) for part in parts], "<u4").tobytes()
        return b"".join([_U32.pack(len(parts)), sizes, *parts])

    def decode_at(self, buf: Any, offset: int, size: int) -> list[Image.Image]:
        (count,) = _U32.unpack_from(buf, offset)
        if 4 + 4 * count > size:
            raise ValueError(f"jpeg_array of {count} images does not fit in its {size} bytes")
        spans = _element_spans(buf, offset + 4, count)
        return [self._jpeg.decode_at(buf, start, length) for start, length in spans]


def lookup(name: str) -> Encoding | None:
    """The image encoding called `name`, or None."""
    elements: dict[str, type[Encoding]] = {"pil": PILEncoding, "jpeg": JPEGEncoding, "png": PNGEncoding}
    if name in elements:
        return elements[name]()
    if name.startswith("list[") and name.endswith("]") and name[5:-1] in elements:
        return ImageListEncoding(name, elements[name[5:-1]]())
    if name in ("jpeg_array", "jpegarray"):
        return JPEGArrayEncoding(name)
    return None
