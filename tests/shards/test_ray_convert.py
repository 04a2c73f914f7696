"""`convert` on Ray and `MDSDatasink`: a real two-node cluster on 127.0.0.1 (tests/ray_cluster.py) and
the test SeaweedFS; the output is read back with MosaicML Streaming.

Exactly-once is checked by killing a worker process while it writes a part, and by killing the driver
before the merge (no index.json; `--mode resume` finishes the dataset).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")

import anchors  # noqa: F401  (registers the torchvision stand-in, then imports streaming)
import ray_cluster
from streaming.base.local import LocalDataset

from tessera.shards import MDSDataset
from tessera.shards.convert import convert
from tessera.shards.ray_engine import plan_parts
from tessera.shards.sources import Chunk
from tessera.storage import open_store

TESSERA = str(Path(sys.executable).parent / "tessera")


def _write_jsonl(path: Path, first: int, count: int, pad: int = 40) -> None:
    with path.open("w") as f:
        for i in range(first, first + count):
            f.write(json.dumps({"id": i, "text": f"doc {i} " + "x" * (i * 7 % pad)}) + "\n")


def _folder(root: Path, files: int, per_file: int, pad: int = 40) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for n in range(files):
        _write_jsonl(root / f"part-{n:02d}.jsonl", n * per_file, per_file, pad)
    return root


def _mosaic_samples(folder: Path) -> list[dict]:
    dataset = LocalDataset(local=str(folder))
    return [dataset[i] for i in range(len(dataset))]


def _ids(url: str) -> list[int]:
    dataset = MDSDataset(url)
    return [int(dataset[i]["id"]) for i in range(len(dataset))]


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([TESSERA, "data", "convert", *args], env=env or ray_cluster.cluster_env(),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cluster(s3_env: dict[str, str]):
    """Head + one worker node, each of one CPU, with the test bucket's credentials in their environment."""
    started = ray_cluster.start_cluster(s3_env)
    yield started
    started.stop()


def test_parts_depend_on_the_chunks_only():
    chunks = [Chunk("jsonl", "f", i, i + 1) for i in range(100)]
    parts = plan_parts(chunks)
    assert [c for part in parts for c in part] == chunks  # every chunk once, in input order
    assert len(parts) >= 16 and plan_parts(chunks) == parts
    assert plan_parts(chunks[:3]) == [[c] for c in chunks[:3]]
    assert plan_parts(chunks, chunks_per_part=40) == [chunks[:40], chunks[40:80], chunks[80:]]


def test_the_issue_check_local_ray_matches_local_workers(tmp_path: Path):
    """`--engine ray --workers 2` (a local Ray started and stopped by the command) reads back, with
    Mosaic's reader, exactly as `--workers 2` on one machine."""
    source = tmp_path / "in.jsonl"
    _write_jsonl(source, 0, 45_000, pad=200)  # ~5 MB: two chunks, so two parts, two Ray tasks
    result = _cli(str(source), str(tmp_path / "OUT"), "--engine", "ray", "--workers", "2", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["extra"]["parts"] == 2
    convert(source, tmp_path / "OUT2", workers=2)  # what `tessera data convert in.jsonl OUT2 --workers 2` runs
    ours, theirs = _mosaic_samples(tmp_path / "OUT"), _mosaic_samples(tmp_path / "OUT2")
    assert len(ours) == 45_000 and ours == theirs
    assert not any(p.name.startswith("tessera-convert") for p in Path("/dev/shm").iterdir() if str(os.getpid()) in p.name)


def test_a_killed_worker_is_retried_exactly_once_reading_and_writing_the_bucket(cluster, s3_bucket: str,
                                                                                 tmp_path: Path):
    """Input under an s3:// prefix, read by the workers themselves; shards and index written to the
    bucket. SIGKILL the worker process running a part once it has stored a shard: Ray retries the task,
    whose part replaces what the killed attempt left, and every sample is in the dataset once, in order."""
    local = _folder(tmp_path / "in", files=4, per_file=4000, pad=300)
    store = open_store(s3_bucket)
    for f in sorted(local.iterdir()):
        store.put(f"raw/{f.name}", f.read_bytes())
    args = [TESSERA, "data", "convert", f"{s3_bucket}/raw/", f"{s3_bucket}/mds", "--engine", "ray", "--address",
            cluster.address, "--workers", "2", "--compression", "zstd:19", "--size-limit", "128kb", "--json"]
    driver = subprocess.Popen(args, env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed: list[int] = []
    deadline = time.monotonic() + 120
    while driver.poll() is None and time.monotonic() < deadline:
        busy = cluster.worker_pids("write_part")
        if busy and not killed and any(".mds" in info.key for info in store.list("mds/part-")):
            os.kill(busy[0], signal.SIGKILL)
            killed.append(busy[0])
        time.sleep(0.01)
    stdout, stderr = driver.communicate(timeout=60)
    assert driver.returncode == 0, stderr
    assert killed, "no worker was caught running a part (the conversion finished too fast)"
    summary = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else {}
    assert summary, (stdout, stderr)
    assert summary["extra"]["parts"] == 4 and summary["samples"] == 16_000
    keys = sorted(info.key for info in store.list("mds/"))
    assert "mds/index.json" in keys and "mds/part-00003/index.json" in keys
    assert _ids(f"{s3_bucket}/mds") == list(range(16_000))


def test_a_killed_driver_leaves_no_index_and_resume_completes(cluster, tmp_path: Path):
    source = _folder(tmp_path / "in", files=4, per_file=3000, pad=300)
    out = tmp_path / "out"
    args = [TESSERA, "data", "convert", str(source), str(out), "--engine", "ray", "--address", cluster.address,
            "--workers", "1", "--size-limit", "256kb"]  # one part at a time: the kill finds later ones undone
    driver = subprocess.Popen(args, env=cluster.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (out / "part-00000" / "index.json").exists() and driver.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    driver.kill()
    driver.wait(timeout=30)
    assert (out / "part-00000" / "index.json").exists()
    assert not (out / "index.json").exists()
    refused = _cli(str(source), str(out), "--engine", "ray", "--address", cluster.address)
    assert refused.returncode != 0 and "--mode resume" in refused.stderr.replace("mode='resume'", "--mode resume")
    time.sleep(1)  # the dead driver's tasks are cancelled by Ray before the rerun writes their parts
    resumed = _cli(str(source), str(out), "--engine", "ray", "--address", cluster.address, "--workers", "2",
                   "--size-limit", "256kb", "--mode", "resume", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.strip().splitlines()[-1])["extra"]["parts_kept"] >= 1
    assert _ids(str(out)) == list(range(12_000))


def test_datasink_writes_a_ray_dataset(cluster, tmp_path: Path):
    """`ray.data.read_parquet(...).write_datasink(MDSDatasink(...))` in order, one part per write task."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray

    from tessera.shards import MDSDatasink

    folder = tmp_path / "parquet"
    folder.mkdir()
    for n in range(3):
        ids = list(range(n * 500, (n + 1) * 500))
        pq.write_table(pa.table({"id": ids, "text": [f"row {i}" for i in ids]}), folder / f"f{n}.parquet")
    os.environ.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    ray.init(address=cluster.address, logging_level="ERROR")
    try:
        context = ray.data.DataContext.get_current()
        context.execution_options.preserve_order = True
        ray.data.read_parquet(str(folder)).write_datasink(
            MDSDatasink(str(tmp_path / "mds"), columns={"id": "int64", "text": "str"}, size_limit="8kb"))
        with pytest.raises(Exception, match="already holds a dataset"):
            ray.data.read_parquet(str(folder)).write_datasink(MDSDatasink(str(tmp_path / "mds"), {"id": "int64"}))
    finally:
        ray.shutdown()
    assert _ids(str(tmp_path / "mds")) == list(range(1500))
    samples = _mosaic_samples(tmp_path / "mds")
    assert samples[1234] == {"id": 1234, "text": "row 1234"}


def test_llm_prep_on_the_cluster_matches_local_prep(cluster, tmp_path: Path):
    """`tessera llm prep --engine ray`: Ray tasks tokenize the chunks, the driver cuts the windows, so
    train/ and val/ are byte-identical to a prep in one process."""
    from tessera.llm.prep import prep

    corpus = _folder(tmp_path / "corpus", files=3, per_file=300)
    prep(corpus, tmp_path / "local", "byte", seq_len=64, text_field="text", val_fraction=0.1)
    result = subprocess.run([TESSERA, "llm", "prep", str(corpus), str(tmp_path / "ray"), "--tokenizer", "byte",
                             "--seq-len", "64", "--val-fraction", "0.1", "--engine", "ray", "--address",
                             cluster.address, "--workers", "2"], env=cluster.env, capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 0, result.stderr
    for split in ("train", "val"):
        ours = sorted(p.relative_to(tmp_path / "ray") for p in (tmp_path / "ray" / split).iterdir())
        assert ours == sorted(p.relative_to(tmp_path / "local") for p in (tmp_path / "local" / split).iterdir())
        for name in ours:
            assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "local" / name).read_bytes()
