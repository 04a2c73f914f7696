"""`dataframe_to_mds`: a Spark DataFrame written as one MDS dataset, partitions in parallel, one index.

As MosaicML Streaming's function of the same name: each partition is written by the executor that holds
it into a folder of its own, and the driver merges the folders' indexes into `out/index.json`. Columns are
inferred from the DataFrame's schema with the same mapping (or checked against it when given), and
`udf_iterable(pandas_frame, **udf_kwargs)` may turn each partition into the samples to write.

Differently from Mosaic, a partition's folder is named after the partition (`part-NNNNN`), not after the
task attempt, and is written in `overwrite` mode with its index committed last: an attempt Spark retries
replaces its own part instead of leaving a second copy beside it, and the merged index lists the parts in
partition order, which is the DataFrame's order. index.json is written last, after every partition.
Shards go straight to `out` (a bucket, or a folder every executor sees); nothing is staged locally.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from tessera.shards.dataset import open_dataset_store
from tessera.shards.ray_engine import check_target, commit_parts, part_name, write_rows_to_part

logger = logging.getLogger(__name__)

# Spark type name -> MDS encoding (None: the type has no MDS encoding), as Mosaic maps them.
SPARK_TO_MDS: dict[str, str | None] = {
    "ByteType": "uint8", "ShortType": "uint16", "IntegerType": "int32", "LongType": "int64",
    "FloatType": "float32", "DoubleType": "float64", "DecimalType": "str_decimal", "StringType": "str",
    "BinaryType": "bytes", "BooleanType": None, "TimestampType": None, "TimestampNTZType": None,
    "DateType": None, "DayTimeIntervalType": None,
}
ARRAY_TO_MDS = {"IntegerType": "ndarray:int32", "ShortType": "ndarray:int16", "LongType": "ndarray:int64",
                "FloatType": "ndarray:float32", "DoubleType": "ndarray:float64"}
JSON_LEAVES = {"StringType", "IntegerType", "FloatType", "BooleanType", "NullType"}
BINARY_ENCODINGS = ("pil", "png", "jpeg", "pkl")


def _name(data_type: Any) -> str:
    return type(data_type).__name__


def mds_encoding(data_type: Any) -> str:
    """The MDS encoding of a Spark type; ValueError when it has none."""
    name = _name(data_type)
    encoding = ARRAY_TO_MDS.get(_name(data_type.elementType)) if name == "ArrayType" else SPARK_TO_MDS.get(name)
    if encoding is None:
        raise ValueError(f"{data_type} is not supported by dataframe_to_mds")
    return encoding


def is_json_compatible(data_type: Any) -> bool:
    """Whether values of this Spark type are JSON (structs, arrays and maps of strings, ints, floats,
    booleans and nulls)."""
    name = _name(data_type)
    if name == "StructType":
        return all(is_json_compatible(f.dataType) for f in data_type.fields)
    if name == "ArrayType":
        return is_json_compatible(data_type.elementType)
    if name == "MapType":
        return is_json_compatible(data_type.keyType) and is_json_compatible(data_type.valueType)
    return name in JSON_LEAVES


def infer_dataframe_schema(dataframe: Any, user_defined_cols: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """Columns for the DataFrame from its schema; with `user_defined_cols`, check those instead (None)."""
    if user_defined_cols is None:
        return {field.name: mds_encoding(field.dataType) for field in dataframe.schema}
    supported = {e for e in [*SPARK_TO_MDS.values(), *ARRAY_TO_MDS.values()] if e}
    for name, wanted in user_defined_cols.items():
        if name not in dataframe.columns:
            raise ValueError(f"{name} is not a column of input dataframe: {dataframe.columns}")
        actual = dataframe.schema[name].dataType
        base = ":".join(wanted.split(":")[:2]) if wanted.startswith("ndarray:") else wanted
        if base not in supported:
            if wanted == "json" and is_json_compatible(actual):
                continue
            if wanted == "json":
                raise ValueError(f"{name} can not be encoded by MDS JSON.")
            if wanted in BINARY_ENCODINGS:
                if _name(actual) == "BinaryType":
                    continue
                raise ValueError(f"Non-binary col {name} cannot encode as {wanted}.")
            raise ValueError(f"{wanted} is not supported by dataframe_to_mds")
        if mds_encoding(actual) != base:
            raise ValueError(f"Mismatched types: column name `{name}` is `{mds_encoding(actual)}` in DataFrame "
                             f"but `{wanted}` in user_defined_cols")
    return None


def _as_sample(row: Mapping[str, Any], columns: Mapping[str, str]) -> dict[str, Any]:
    """Spark gives arrays as lists; ndarray columns want numpy arrays of their dtype."""
    sample = dict(row)
    for name, encoding in columns.items():
        if encoding.startswith("ndarray:") and isinstance(sample.get(name), list):
            sample[name] = np.asarray(sample[name], dtype=encoding.split(":")[1])
    return sample


def _partition_writer(url: str, columns: dict[str, str], options: dict[str, Any], udf: Callable | None,
                      udf_kwargs: dict[str, Any]) -> Callable[[int, Iterator[Any]], Iterator[tuple[int, int]]]:
    def write(partition: int, rows: Iterator[Any]) -> Iterator[tuple[int, int]]:
        records: Iterable[Mapping[str, Any]] = (row.asDict(recursive=True) for row in rows)
        if udf is not None:
            import pandas as pd

            records = udf(pd.DataFrame([dict(r) for r in records]), **udf_kwargs)
            if not isinstance(records, Iterable):
                raise TypeError(f"udf_iterable must return an iterable, not a {type(records).__name__}")
        yield partition, write_rows_to_part(url, partition, columns, (_as_sample(r, columns) for r in records),
                                            **options)

    return write


def dataframe_to_mds(dataframe: Any, out: str | None = None, columns: Mapping[str, str] | None = None, *,
                     merge_index: bool = True, mds_kwargs: Mapping[str, Any] | None = None,
                     udf_iterable: Callable | None = None, udf_kwargs: Mapping[str, Any] | None = None,
                     compression: str | None = None, hashes: Iterable[str] | None = None,
                     size_limit: int | str | None = "64mb", mode: str = "create") -> str:
    """Write `dataframe` as an MDS dataset at `out`; returns the dataset's URL.

    Mosaic's call works too: `dataframe_to_mds(df, mds_kwargs={"out": ..., "columns": ...})` (its
    compression defaults to zstd there, as in Mosaic). `merge_index=False` leaves only the part folders
    (merge them later with `tessera data merge-index OUT`)."""
    kwargs = dict(mds_kwargs or {})
    if mds_kwargs is not None and compression is None:
        compression = kwargs.get("compression", "zstd")
    out = out if out is not None else kwargs.get("out")
    if isinstance(out, tuple):  # Mosaic's (local, remote): shards go straight to the remote
        out = out[1] or out[0]
    if not out:
        raise ValueError("`out` and `columns` need to be specified (as arguments, or in `mds_kwargs`)")
    columns = dict(columns or kwargs.get("columns") or {}) or None
    if dataframe is None or dataframe.isEmpty():
        raise ValueError("Input dataframe is None or Empty!")
    if udf_iterable is not None:
        if columns is None:
            raise ValueError("If udf_iterable is specified, user must provide correct `columns`")
    elif columns is None:
        columns = infer_dataframe_schema(dataframe)
        logger.info("dataframe_to_mds: inferred columns %s", columns)
    else:
        infer_dataframe_schema(dataframe, columns)
    assert columns is not None
    store = open_dataset_store(str(out))
    check_target(store, mode)
    options = {"compression": compression, "hashes": tuple(hashes or kwargs.get("hashes") or ()) or None,
               "size_limit": kwargs.get("size_limit", size_limit)}
    write = _partition_writer(store.url, dict(columns), options, udf_iterable, dict(udf_kwargs or {}))
    written = dataframe.rdd.mapPartitionsWithIndex(write).collect()
    if merge_index:
        commit_parts(store, [part_name(p) for p, count in sorted(written) if count])
    return store.url
