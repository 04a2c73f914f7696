"""Hugging Face `datasets` on disk as inputs: folders written by `save_to_disk`, and Parquet folders.

`Dataset.save_to_disk(DIR)` writes Arrow IPC stream files (`data-00000-of-00002.arrow`, ...) with a
`state.json` naming them in order, and `dataset_info.json`. Each Arrow file is one chunk, read with
memory mapping; rows come in the order of `state.json`, which is the dataset's order. A `DatasetDict`
(`dataset_dict.json` at the top, one such folder per split) is refused with the splits to choose from:
which split to convert is the user's call. A Parquet folder as the Hub holds them (`data/*.parquet`
beside a README.md) is a Parquet input whose other files are metadata.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tessera.shards.inputs import is_url, read_all

STATE = "state.json"
DICT_MARKER = "dataset_dict.json"
# Files a Hub dataset folder holds beside its data; they do not make a Parquet folder a text corpus.
METADATA_FILES = {"readme.md", "dataset_info.json", "dataset_infos.json", "state.json", "license", "license.md",
                  "citation.cff"}


class SavedDatasetError(ValueError):
    """A `save_to_disk` folder that cannot be converted as it is (a DatasetDict, a broken state.json)."""


def saved_dataset_files(root: str | os.PathLike[str]) -> list[str] | None:
    """The Arrow files of a `save_to_disk` folder in dataset order; None when `root` is not one."""
    if is_url(root):
        return None
    folder = Path(root)
    if (folder / DICT_MARKER).is_file():
        splits = json.loads((folder / DICT_MARKER).read_text()).get("splits", [])
        raise SavedDatasetError(f"{folder}: a DatasetDict; convert one split, e.g. "
                                + ", ".join(str(folder / s) for s in splits))
    if not (folder / STATE).is_file():
        return None
    try:
        files = [entry["filename"] for entry in json.loads((folder / STATE).read_text())["_data_files"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise SavedDatasetError(f"{folder / STATE}: not a datasets state file ({exc})") from None
    return [str(folder / name) for name in files]


def is_parquet_folder(names: list[str]) -> bool:
    """Parquet files plus, at most, the metadata files of a Hub dataset folder."""
    data = [n for n in names if os.path.basename(n).lower() not in METADATA_FILES]
    return bool(data) and all(n.lower().endswith(".parquet") for n in data)


def read_arrow_file(path: str) -> Any:
    """An Arrow IPC stream file (what `save_to_disk` writes) as a table; local files memory-mapped."""
    import pyarrow as pa

    source = pa.memory_map(path) if not is_url(path) else pa.BufferReader(read_all(path))
    with pa.ipc.open_stream(source) as reader:
        return reader.read_all()
