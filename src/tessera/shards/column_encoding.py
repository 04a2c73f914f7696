"""The interface every MDS column encoding implements, apart from the encodings themselves.

`encodings.py` (numbers, text, arrays) and `image_encodings.py` (PIL, JPEG, PNG) both subclass
`Encoding`; keeping the base here lets `encodings.lookup_encoding` load the image module on demand
(it imports PIL, ~0.15 s) without the two modules importing each other.
"""

from __future__ import annotations

from typing import Any

Buffer = bytes | bytearray | memoryview  # also mmap.mmap: anything np.frombuffer and slicing accept


class Encoding:
    """One MDS column encoding. Subclasses set `name` and `size` and implement `encode`/`decode_at`."""

    name: str = ""
    size: int | None = None  # fixed byte size, or None when each value carries a u32 size header
    safe: bool = True  # False when decoding can execute code (pickle)

    def encode(self, value: Any) -> bytes:
        """Serialize one value; raise TypeError/ValueError with a short reason when it does not fit."""
        raise NotImplementedError

    def decode_at(self, buf: Any, offset: int, size: int) -> Any:
        """Decode the value stored in `buf[offset:offset + size]`."""
        raise NotImplementedError

    def decode(self, data: Buffer) -> Any:
        """Decode a value from its own bytes (convenience for tests and tools)."""
        return self.decode_at(data, 0, len(data))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
