"""Every MDS column encoding round-trips, has the documented fixed size and byte layout, and refuses
what it cannot store with an error naming the column and encoding."""

from __future__ import annotations

import io
import math
import pickle
from decimal import Decimal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from PIL import Image

from tessera.shards.encodings import (
    ENCODING_NAMES,
    NDARRAY_DTYPE_CODES,
    NDArrayEncoding,
    encode_value,
    encoding_size,
    get_encoding,
    is_encoding,
    is_safe,
)

INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
FLOATS = {"float16": 16, "float32": 32, "float64": 64}
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


def roundtrip(name: str, value: object) -> object:
    encoding = get_encoding(name)
    data = encode_value(encoding, value)
    if encoding.size is not None:
        assert len(data) == encoding.size
    # decode from the middle of a larger buffer, as readers do on a mapped shard
    buf = b"\xaa" * 7 + bytes(data) + b"\xbb" * 5
    return encoding.decode_at(buf, 7, len(data))


@given(st.binary(max_size=300))
def test_bytes(value: bytes) -> None:
    assert roundtrip("bytes", value) == value


@given(st.text(max_size=200))
def test_str(value: str) -> None:
    assert roundtrip("str", value) == value


@given(st.integers(-(2**63), 2**63 - 1))
def test_int_is_int64_and_decodes_to_python_int(value: int) -> None:
    out = roundtrip("int", value)
    assert out == value and type(out) is int
    assert get_encoding("int").encode(value) == np.int64(value).tobytes()


@pytest.mark.parametrize("name", INTS)
@settings(max_examples=30)
@given(data=st.data())
def test_integer_scalars(name: str, data: st.DataObject) -> None:
    info = np.iinfo(name)
    value = data.draw(st.integers(int(info.min), int(info.max)))
    out = roundtrip(name, value)
    assert out == value and out.dtype == np.dtype(name)
    assert encoding_size(name) == np.dtype(name).itemsize


@pytest.mark.parametrize("name", sorted(FLOATS))
@settings(max_examples=30)
@given(data=st.data())
def test_float_scalars(name: str, data: st.DataObject) -> None:
    value = data.draw(st.floats(width=FLOATS[name]))
    out = roundtrip(name, value)
    assert out.tobytes() == np.dtype(name).type(value).tobytes()  # bit-exact, NaN included
    assert encoding_size(name) == FLOATS[name] // 8


@given(st.integers())
def test_str_int(value: int) -> None:
    assert roundtrip("str_int", value) == value


@given(st.floats())
def test_str_float(value: float) -> None:
    out = roundtrip("str_float", value)
    assert (math.isnan(out) and math.isnan(value)) or out == value


@given(st.decimals())
def test_str_decimal(value: Decimal) -> None:
    out = roundtrip("str_decimal", value)
    assert str(out) == str(value)


@given(json_values)
def test_json(value: object) -> None:
    assert roundtrip("json", value) == value


def test_json_stores_arrays_as_lists() -> None:
    assert roundtrip("json", np.arange(3)) == [0, 1, 2]


@given(st.tuples(st.integers(), st.frozensets(st.text(max_size=5)), st.none()))
def test_pkl(value: object) -> None:
    assert roundtrip("pkl", value) == value
    assert get_encoding("pkl").encode(value) == pickle.dumps(value)
    assert not is_safe("pkl") and is_safe("bytes")


supported_dtypes = st.sampled_from(sorted(NDARRAY_DTYPE_CODES)).map(np.dtype)


@st.composite
def arrays(draw: st.DrawFn, max_side: int = 40) -> np.ndarray:
    dtype = draw(supported_dtypes)
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=max_side))
    return draw(hnp.arrays(dtype, shape, elements={"allow_nan": False} if dtype.kind == "f" else None))


@settings(max_examples=60)
@given(arrays())
def test_ndarray_all_forms(array: np.ndarray) -> None:
    dims = ",".join(map(str, array.shape))
    for name in ("ndarray", "ndarray:", f"ndarray:{array.dtype.name}", f"ndarray:{array.dtype.name}:{dims}"):
        out = roundtrip(name, array)
        assert out.dtype == array.dtype and out.shape == array.shape
        assert np.array_equal(out, array)
        assert not out.flags.writeable  # a read-only view of the buffer
    static = get_encoding(f"ndarray:{array.dtype.name}:{dims}")
    assert static.size == array.nbytes
    assert get_encoding(f"ndarray:{array.dtype.name}").size is None


def test_ndarray_layout_example_from_mds_md() -> None:
    data = get_encoding("ndarray").encode(np.ones((2, 3), np.float32))
    assert data[:4] == bytes([0x22, 0x08, 0x02, 0x03])
    assert data[4:] == np.ones(6, np.float32).tobytes() and len(data) == 28


@pytest.mark.parametrize(("side", "code"), [(255, 0), (256, 1), (65535, 1), (65536, 2), (1 << 32, 3)])
def test_ndarray_shape_code_is_smallest_type(side: int, code: int) -> None:
    header = NDArrayEncoding._shape_header((1, side))
    assert header[0] == (2 << 2) | code
    assert int.from_bytes(header[1 + (1 << code) :], "little") == side


def test_ndarray_big_dims_roundtrip() -> None:
    array = np.arange(70000, dtype=np.uint8).reshape(1, 70000)
    assert np.array_equal(roundtrip("ndarray", array), array)


def test_ndarray_big_endian_input_is_stored_little_endian() -> None:
    array = np.arange(5, dtype=">u2")
    assert np.array_equal(roundtrip("ndarray:uint16:5", array), array)
    assert np.array_equal(roundtrip("ndarray", array), array)


def test_ndarray_non_contiguous_input() -> None:
    array = np.arange(20, dtype=np.int32).reshape(4, 5)[:, ::2]
    assert np.array_equal(roundtrip("ndarray:int32:4,3", array), array)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("ndarray", np.zeros((0, 3), np.uint8), "empty and 0-d"),
        ("ndarray", np.array(3, np.uint8), "empty and 0-d"),
        ("ndarray", np.zeros(3, np.complex64), "unsupported dtype"),
        ("ndarray:uint16", np.zeros(3, np.uint8), "expected dtype uint16"),
        ("ndarray:uint8:2,2", np.zeros(3, np.uint8), "expected shape"),
        ("ndarray", np.zeros((1,) * 64, np.uint8), "at most 63"),
        ("ndarray", [1, 2], "numpy array"),
        ("int", 1.5, "expected an int"),
        ("str", 3, "expected str"),
        ("str_float", 3, "expected float"),
        ("pil", "not an image", "PIL image"),
    ],
)
def test_bad_values_are_refused(name: str, value: object, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        get_encoding(name).encode(value)


def test_scalar_out_of_range_is_refused() -> None:
    with pytest.raises((OverflowError, ValueError)):
        get_encoding("uint8").encode(300)


def test_preencoded_bytes_pass_through_every_encoding() -> None:
    for name in ("str", "json", "png", "ndarray", "ndarray:uint8:3", "int", "pkl"):
        assert encode_value(get_encoding(name), b"\x01\x02\x03") == b"\x01\x02\x03"


@pytest.mark.parametrize(
    "name", ["strr", "ndarray:bool", "ndarray:uint8:0", "ndarray:uint8:a", "ndarray:uint8:2:3", "str:x", "list[str]"]
)
def test_unknown_encodings(name: str) -> None:
    assert not is_encoding(name)
    with pytest.raises(ValueError, match="unknown MDS encoding"):
        get_encoding(name)


def test_every_listed_encoding_resolves_and_sizes_are_documented() -> None:
    assert all(is_encoding(name) for name in ENCODING_NAMES)
    sizes = {"int": 8, "int8": 1, "uint16": 2, "int32": 4, "uint64": 8, "float16": 2, "float64": 8,
             "ndarray:uint16:2048": 4096, "ndarray:float32:2,3": 24}
    for name, size in sizes.items():
        assert encoding_size(name) == size
    for name in ("bytes", "str", "json", "pkl", "pil", "jpeg", "png", "list[png]", "jpeg_array", "ndarray"):
        assert encoding_size(name) is None


# --- images ----------------------------------------------------------------------------------------

image_modes = st.sampled_from(["L", "RGB", "RGBA"])


@st.composite
def images(draw: st.DrawFn, modes: st.SearchStrategy[str] = image_modes) -> Image.Image:
    mode = draw(modes)
    width, height = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    channels = len(mode)
    pixels = draw(hnp.arrays(np.uint8, (height, width, channels) if channels > 1 else (height, width)))
    return Image.fromarray(pixels, mode)


def same_pixels(a: Image.Image, b: Image.Image) -> bool:
    return a.mode == b.mode and a.size == b.size and a.tobytes() == b.tobytes()


@settings(max_examples=25)
@given(images())
def test_pil_and_png_are_lossless(image: Image.Image) -> None:
    assert same_pixels(roundtrip("pil", image), image)
    assert same_pixels(roundtrip("png", image), image)


def test_pil_layout() -> None:
    image = Image.new("RGB", (3, 2), (1, 2, 3))
    data = get_encoding("pil").encode(image)
    assert data[:15] == (3).to_bytes(4, "little") + (2).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"RGB"
    assert data[15:] == image.tobytes()


@settings(max_examples=10)
@given(images(st.sampled_from(["L", "RGB"])))
def test_jpeg_roundtrip_keeps_size_and_mode(image: Image.Image) -> None:
    out = roundtrip("jpeg", image)
    assert out.size == image.size and out.mode == image.mode
    saved = io.BytesIO()
    image.save(saved, format="JPEG")  # default quality 75, as MDS stores non-file images
    assert get_encoding("jpeg").encode(image) == saved.getvalue()


def test_jpeg_from_file_keeps_original_bytes(tmp_path) -> None:
    path = tmp_path / "x.jpg"
    Image.new("RGB", (8, 8), (200, 10, 10)).save(path, quality=93)
    with Image.open(path) as image:
        assert get_encoding("jpeg").encode(image) == path.read_bytes()


@settings(max_examples=15)
@given(st.lists(images(st.sampled_from(["L", "RGB"])), max_size=3))
def test_image_lists(items: list[Image.Image]) -> None:
    for name in ("list[pil]", "list[png]"):
        out = roundtrip(name, items)
        assert len(out) == len(items) and all(same_pixels(a, b) for a, b in zip(out, items, strict=True))
    out = roundtrip("list[jpeg]", items)
    assert [im.size for im in out] == [im.size for im in items]
    data = get_encoding("list[png]").encode(items)
    assert data[:8] == (0).to_bytes(4, "little") + len(items).to_bytes(4, "little")


@pytest.mark.parametrize("name", ["jpeg_array", "jpegarray"])
def test_jpeg_array(name: str) -> None:
    blobs = []
    for color in (10, 200):
        out = io.BytesIO()
        Image.new("RGB", (4, 3), (color, 0, 0)).save(out, format="JPEG")
        blobs.append(out.getvalue())
    data = get_encoding(name).encode(blobs)
    assert data[:4] == (2).to_bytes(4, "little") and data.endswith(blobs[0] + blobs[1])
    decoded = roundtrip(name, blobs)
    assert [im.size for im in decoded] == [(4, 3), (4, 3)]
