"""Tessera's errors are also the built-in exceptions MosaicML Streaming raises for the same cases, so a
switched user's `except` clauses still catch them: each case is triggered through real code, caught as
the Tessera class and as the built-in, and where Mosaic has the same case its own code is checked to
raise that built-in too. The errors also survive a DataLoader worker (torch rebuilds them from their
message) and pickling with their class and attributes."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anchors  # (registers the torchvision stand-in, then imports streaming)
import numpy as np
import pytest
from torch.utils.data._utils import ExceptionWrapper

from tessera.shards import MDSDataset, ShardWriter
from tessera.shards.errors import (
    ColumnMismatch,
    DatasetExists,
    DatasetNotFound,
    EncodeError,
    EncodeTypeError,
    HashMismatch,
    IndexFormatError,
    MissingShard,
    ShardError,
    UnknownEncoding,
)
from tessera.storage import open_store
from tessera.storage.errors import InvalidURL, NotFound
from tessera.stream import CacheLimitError, StreamingDataset


def _write(folder: Path, n: int = 20, **kwargs: Any) -> Path:
    with ShardWriter(folder, {"x": "int", "s": "str"}, **kwargs) as writer:
        for i in range(n):
            writer.write({"x": i, "s": f"s{i}"})
    return folder


def _catch(fn: Callable[[], Any], ours: type[BaseException], builtin: type[BaseException]) -> BaseException:
    """`fn` raises an error that is both `ours` and `builtin`, with a message that is one line."""
    with pytest.raises(ours) as caught:
        fn()
    assert isinstance(caught.value, builtin), type(caught.value).__mro__
    assert str(caught.value) and "\n" not in str(caught.value)
    return caught.value


# --- writer cases, next to Mosaic's MDSWriter for the same input ----------------------------------------

WRITER_CASES = {
    # case: (columns, writer kwargs, sample or None, Tessera class, Mosaic's built-in)
    "unknown encoding": ({"x": "bogus"}, {}, None, UnknownEncoding, TypeError),
    "missing column": ({"x": "int", "s": "str"}, {}, {"x": 1}, ColumnMismatch, KeyError),
    "wrong type (str)": ({"s": "str"}, {}, {"s": 5}, EncodeTypeError, AttributeError),
    "wrong type (int)": ({"x": "int"}, {}, {"x": "z"}, EncodeTypeError, AttributeError),
    "wrong type (bytes)": ({"b": "bytes"}, {}, {"b": "text"}, EncodeTypeError, AttributeError),
    "wrong dtype": ({"a": "ndarray:int16:3"}, {}, {"a": np.zeros(3, np.int32)}, EncodeError, ValueError),
    "size_limit too large": ({"x": "int"}, {"size_limit": 2**32}, None, ValueError, ValueError),
    "unknown compression": ({"x": "int"}, {"compression": "lz77"}, None, ValueError, ValueError),
    "unknown hash": ({"x": "int"}, {"hashes": ["nope"]}, None, ValueError, ValueError),
}


@pytest.mark.parametrize("case", list(WRITER_CASES))
def test_writer_errors_are_mosaics_builtins(tmp_path: Path, case: str) -> None:
    columns, kwargs, sample, ours, builtin = WRITER_CASES[case]

    def tessera() -> None:
        with ShardWriter(tmp_path / "ours", columns, **kwargs) as writer:
            writer.write(sample)

    def mosaic() -> None:
        writer = anchors.MDSWriter(out=str(tmp_path / "theirs"), columns=columns, **kwargs)
        writer.write(sample)

    error = _catch(tessera, ours, builtin)
    assert isinstance(error, ShardError | ValueError)
    with pytest.raises(builtin):
        mosaic()


def test_writer_refuses_an_existing_dataset_as_file_exists(tmp_path: Path) -> None:
    _write(tmp_path / "ds")
    _catch(lambda: ShardWriter(tmp_path / "ds", {"x": "int"}), DatasetExists, FileExistsError)
    with pytest.raises(FileExistsError):
        anchors.MDSWriter(out=str(tmp_path / "ds"), columns={"x": "int"})


# --- reader and dataset cases ----------------------------------------------------------------------------


def test_hash_mismatch_is_a_value_error(tmp_path: Path) -> None:
    folder = _write(tmp_path / "ds", hashes=["sha1"])
    shard = folder / "shard.00000.mds"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    error = _catch(lambda: MDSDataset(folder, verify_hashes=True)[0], HashMismatch, ValueError)
    assert "shard.00000.mds" in str(error) and "sha1" in str(error)


def test_missing_index_is_file_not_found(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    _catch(lambda: MDSDataset(tmp_path / "empty"), DatasetNotFound, FileNotFoundError)
    _catch(lambda: StreamingDataset(remote=str(tmp_path / "empty"), local=str(tmp_path / "cache")),
           DatasetNotFound, FileNotFoundError)


def test_missing_shard_file_is_file_not_found(tmp_path: Path) -> None:
    folder = _write(tmp_path / "ds")
    (folder / "shard.00000.mds").unlink()
    error = _catch(lambda: MDSDataset(folder)[0], MissingShard, FileNotFoundError)
    assert "shard.00000.mds" in str(error)


def test_unknown_encoding_on_read_is_a_key_error(tmp_path: Path) -> None:
    folder = _write(tmp_path / "ds")
    for name in ("index.json", "shard.00000.mds"):  # "sxr": same length, so the offsets stay right
        path = folder / name
        path.write_bytes(path.read_bytes().replace(b'"str"', b'"sxr"'))
    error = _catch(lambda: MDSDataset(folder)[0], UnknownEncoding, KeyError)
    assert isinstance(error, TypeError) and "'sxr'" in str(error) and "shard 0" in str(error)


def test_corrupt_index_is_a_value_error(tmp_path: Path) -> None:
    folder = _write(tmp_path / "ds")
    (folder / "index.json").write_text('{"shards": [')
    error = _catch(lambda: MDSDataset(folder), IndexFormatError, ValueError)
    assert "index.json" in str(error)


def test_sample_index_out_of_range_is_an_index_error(tmp_path: Path) -> None:
    folder = _write(tmp_path / "ds", n=5)
    with pytest.raises(IndexError):
        MDSDataset(folder)[5]
    with pytest.raises(IndexError):
        StreamingDataset(local=str(folder))[5]


def test_cache_limit_too_small_is_a_value_error(tmp_path: Path) -> None:
    folder = _write(tmp_path / "ds", n=200)
    _catch(lambda: StreamingDataset(remote=str(folder), local=str(tmp_path / "cache"), cache_limit="10b"),
           CacheLimitError, ValueError)


def test_bad_parameter_values_are_value_errors(tmp_path: Path) -> None:
    folder = _write(tmp_path / "ds")
    for kwargs in ({"shuffle_algo": "bogus"}, {"epoch_size": "-1k"}, {"partition_algo": "bogus"},
                   {"cache_limit": "lots"}):
        with pytest.raises(ValueError):
            StreamingDataset(local=str(folder), **kwargs)


def test_storage_errors_are_builtins(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    _catch(lambda: store.get("nope.bin"), NotFound, FileNotFoundError)
    _catch(lambda: open_store("bogus://bucket/x"), InvalidURL, ValueError)


# --- errors cross process boundaries with their class ----------------------------------------------------


def _made_errors(tmp_path: Path) -> list[BaseException]:
    folder = _write(tmp_path / "ds", hashes=["sha1"])
    (folder / "shard.00000.mds").write_bytes(b"\0" * 8)
    made = []
    for fn in (lambda: MDSDataset(folder)[0], lambda: MDSDataset(tmp_path), lambda: open_store(tmp_path).get("x"),
               lambda: ShardWriter(tmp_path / "o", {"x": "bogus"}),
               lambda: ShardWriter(tmp_path / "p", {"x": "int"}).write({"y": 1})):
        with pytest.raises(Exception) as caught:  # noqa: B017 - each is checked below
            fn()
        made.append(caught.value)
    return made


def test_errors_survive_a_dataloader_worker_and_pickling(tmp_path: Path) -> None:
    for error in _made_errors(tmp_path):
        kind = type(error)
        try:
            raise error
        except Exception:
            wrapped = ExceptionWrapper(where="in DataLoader worker process 0")
        with pytest.raises(kind) as caught:  # what torch raises in the training process
            wrapped.reraise()
        assert str(error) in str(caught.value)
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is kind and str(copy) == str(error) and copy.__dict__ == error.__dict__
