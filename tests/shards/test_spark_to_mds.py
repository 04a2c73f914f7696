"""`tessera.shards.spark.dataframe_to_mds` with a local Spark session (Java from scripts/java-up.sh);
the behaviour checks of Mosaic's own tests for its function, in our words, read back with Mosaic."""

from __future__ import annotations

import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pyspark")

import anchors  # noqa: F401  (registers the torchvision stand-in, then imports streaming)
from streaming.base.local import LocalDataset

from tessera.shards import MDSDataset
from tessera.shards.spark import dataframe_to_mds, infer_dataframe_schema, is_json_compatible

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def spark():
    result = subprocess.run([str(ROOT / "scripts" / "java-up.sh")], capture_output=True, text=True, timeout=600)
    if result.returncode == 3:
        pytest.skip(f"no Java runtime for Spark and none could be installed: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    os.environ.setdefault("JAVA_HOME", result.stdout.strip())
    os.environ["PYSPARK_PYTHON"] = sys.executable  # executors run this venv's Python (it has tessera)
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("tessera-tests")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def dataframe(spark):
    rows = [(i, f"text {i}", float(i) / 2) for i in range(300)]
    return spark.createDataFrame(rows, "id long, text string, score double").repartition(3, "id").sortWithinPartitions("id")


def _mosaic(folder: Path) -> list[dict]:
    dataset = LocalDataset(local=str(folder))
    return [dataset[i] for i in range(len(dataset))]


def test_inferred_columns_partition_order_and_mosaic_reads_it(dataframe, tmp_path: Path):
    expected = [row.asDict() for row in dataframe.collect()]  # partition order, then row order
    url = dataframe_to_mds(dataframe, str(tmp_path / "mds"), size_limit="1kb")
    assert url.endswith("mds")
    assert sorted(p.name for p in (tmp_path / "mds").iterdir()) == ["index.json", "part-00000", "part-00001",
                                                                   "part-00002"]
    assert _mosaic(tmp_path / "mds") == expected
    ds = MDSDataset(str(tmp_path / "mds"))
    first = ds.index.shards[0]
    assert dict(zip(first.column_names, first.column_encodings, strict=True)) == {
        "id": "int64", "text": "str", "score": "float64"}
    with pytest.raises(Exception, match="already holds a dataset"):
        dataframe_to_mds(dataframe, str(tmp_path / "mds"))


def test_mosaic_call_with_mds_kwargs_compresses_with_zstd(dataframe, tmp_path: Path):
    dataframe_to_mds(dataframe, mds_kwargs={"out": str(tmp_path / "mds"), "columns": {"id": "int64", "text": "str"}})
    ds = MDSDataset(str(tmp_path / "mds"))
    assert {e.compression for e in ds.index.shards} == {"zstd"}
    assert sorted(int(ds[i]["id"]) for i in range(len(ds))) == list(range(300))


def test_user_columns_are_checked_against_the_schema(dataframe, tmp_path: Path):
    with pytest.raises(ValueError, match="is not a column of input dataframe"):
        dataframe_to_mds(dataframe, str(tmp_path / "a"), columns={"missing": "str"})
    with pytest.raises(ValueError, match="is not supported by dataframe_to_mds"):
        dataframe_to_mds(dataframe, str(tmp_path / "b"), columns={"id": "complex128"})
    with pytest.raises(ValueError, match="Mismatched types"):
        dataframe_to_mds(dataframe, str(tmp_path / "c"), columns={"id": "str"})
    with pytest.raises(ValueError, match="cannot encode as jpeg"):
        dataframe_to_mds(dataframe, str(tmp_path / "d"), columns={"text": "jpeg"})


def test_unsupported_types_and_empty_frames_are_refused(spark, tmp_path: Path):
    flags = spark.createDataFrame([(True,)], "flag boolean")
    with pytest.raises(ValueError, match="is not supported by dataframe_to_mds"):
        dataframe_to_mds(flags, str(tmp_path / "a"))
    with pytest.raises(ValueError, match="Empty"):
        dataframe_to_mds(flags.limit(0), str(tmp_path / "b"))


def test_decimals_arrays_and_json(spark, tmp_path: Path):
    from pyspark.sql.types import (
        ArrayType,
        DecimalType,
        IntegerType,
        MapType,
        StringType,
        StructField,
        StructType,
    )

    schema = StructType([StructField("price", DecimalType(10, 2)), StructField("ids", ArrayType(IntegerType())),
                         StructField("meta", MapType(StringType(), IntegerType()))])
    frame = spark.createDataFrame([(Decimal("1.25"), [1, 2, 3], {"a": 1}), (Decimal("7.50"), [4], {"b": 2})],
                                  schema).coalesce(1)
    assert infer_dataframe_schema(frame.select("price", "ids")) == {"price": "str_decimal", "ids": "ndarray:int32"}
    assert is_json_compatible(frame.schema["meta"].dataType)
    dataframe_to_mds(frame, str(tmp_path / "mds"), columns={"price": "str_decimal", "ids": "ndarray:int32",
                                                            "meta": "json"})
    samples = _mosaic(tmp_path / "mds")
    assert samples[0]["price"] == Decimal("1.25") and samples[1]["meta"] == {"b": 2}
    np.testing.assert_array_equal(samples[0]["ids"], np.array([1, 2, 3], dtype=np.int32))


def test_udf_iterable_makes_the_samples(dataframe, tmp_path: Path):
    def doubled(frame, factor):
        for record in frame.to_dict("records"):
            yield {"id": int(record["id"]) * factor}

    with pytest.raises(ValueError, match="must provide correct `columns`"):
        dataframe_to_mds(dataframe, str(tmp_path / "a"), udf_iterable=doubled)
    dataframe_to_mds(dataframe, str(tmp_path / "mds"), columns={"id": "int64"}, udf_iterable=doubled,
                     udf_kwargs={"factor": 2})
    assert sorted(s["id"] for s in _mosaic(tmp_path / "mds")) == [2 * i for i in range(300)]


def test_without_merge_the_parts_merge_later(dataframe, tmp_path: Path):
    from tessera.shards import merge_index

    dataframe_to_mds(dataframe, str(tmp_path / "mds"), merge_index=False)
    assert not (tmp_path / "mds" / "index.json").exists()
    merge_index(str(tmp_path / "mds"))
    assert len(_mosaic(tmp_path / "mds")) == 300
