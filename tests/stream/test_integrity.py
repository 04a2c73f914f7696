"""No silent wrong data in the streaming path: validate_hash checks every shard file on its first use in a
process, wherever the file came from (a local-only dataset, a cache filled earlier, a download now), and
a compressed shard that inflates past its declared size is an error naming it, not an out-of-memory kill.

MosaicML Streaming checks hashes only right after a download; a file already in its cache, or a local
dataset, is served unchecked. Its checksum failure is a ValueError, so ours is one too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import helpers
import pytest
import zstandard

from tessera.shards import ShardWriter
from tessera.shards.errors import CorruptShard
from tessera.storage import IntegrityError, open_store
from tessera.stream import StreamingDataset, integrity

N = 90
COLUMNS = {"id": "int", "s": "str"}


def write(out: str | Path, compression: str | None = None) -> None:
    with ShardWriter(out, COLUMNS, size_limit=700, hashes=["sha1", "xxh64"], compression=compression) as writer:
        for i in range(N):
            writer.write({"id": i, "s": helpers.expected_s(i)})


def shard_names(folder: Path, key: str = "raw_data") -> list[str]:
    return [e[key]["basename"] for e in json.loads((folder / "index.json").read_text())["shards"]]


def flip_last_byte(path: Path) -> None:
    """Replace the file by a copy with one payload byte flipped (the size stays, so only a hash can tell).

    A new file, not an in-place write: this process may have verified the old one, and a rewrite within
    the file system's timestamp granularity would keep its (inode, size, mtime) key."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(bytes(data))
    os.replace(tmp, path)


def read_all(**kwargs) -> list[dict]:
    ds = StreamingDataset(batch_size=10, shuffle=False, **kwargs)
    return list(ds)


def assert_right(samples: list[dict]) -> None:
    assert sorted(int(s["id"]) for s in samples) == list(range(N))
    assert all(s["s"] == helpers.expected_s(int(s["id"])) for s in samples)


def test_local_only_dataset_is_hashed_on_first_use(tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    write(ds)
    assert_right(read_all(local=str(ds), validate_hash="xxh64"))
    victim = ds / shard_names(ds)[1]
    flip_last_byte(victim)
    with pytest.raises(IntegrityError, match=rf"xxh64 digest of {victim} is [0-9a-f]+ but index.json records"):
        read_all(local=str(ds), validate_hash="xxh64")
    with pytest.raises(ValueError, match="sha1"):  # what a MosaicML `except ValueError` expects
        read_all(local=str(ds), validate_hash="sha1")


def test_a_file_already_in_the_cache_is_hashed_then_fetched_again_once_deleted(tmp_path: Path) -> None:
    src, cache = tmp_path / "src", tmp_path / "cache"
    write(src)
    assert_right(read_all(remote=str(src), local=str(cache)))  # fills the cache, nothing hashed
    cached = cache / shard_names(src)[2]
    flip_last_byte(cached)  # bit rot, or a bad copy by another job sharing the cache
    with pytest.raises(IntegrityError, match=f"sha1 digest of {cached}"):
        read_all(remote=str(src), local=str(cache), validate_hash="sha1")
    cached.unlink()  # what the error says to do
    assert_right(read_all(remote=str(src), local=str(cache), validate_hash="sha1"))


def test_each_file_is_hashed_once_per_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ds = tmp_path / "ds"
    write(ds)
    hashed = []
    real = integrity.new_hasher

    def counting(algo: str):
        hashed.append(algo)
        return real(algo)

    monkeypatch.setattr(integrity, "new_hasher", counting)
    for _ in range(3):  # three datasets over the same files: each file hashed by the first only
        assert_right(read_all(local=str(ds), validate_hash="xxh64"))
    # one hasher per shard file, plus one per dataset for the algorithm check at start-up
    assert hashed == ["xxh64"] * (len(shard_names(ds)) + 3)


def test_a_hash_the_index_does_not_record_is_refused_at_start(tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    write(ds)
    with pytest.raises(ValueError, match=r"index.json: validate_hash='md5' but shard 0 .* records only "
                                         r"\['sha1', 'xxh64'\]"):
        StreamingDataset(local=str(ds), batch_size=10, validate_hash="md5")
    with pytest.raises(ValueError, match="unsupported hash 'nope'"):
        StreamingDataset(local=str(ds), batch_size=10, validate_hash="nope")


def test_corrupt_compressed_download_on_s3_is_refused(s3_bucket: str, tmp_path: Path) -> None:
    remote = f"{s3_bucket}/zstd"
    local = tmp_path / "ref"
    write(remote, "zstd")
    write(local, "zstd")  # the same bytes, to learn the names
    store = open_store(remote)
    name = shard_names(local, "zip_data")[1]
    data = bytearray(store.get(name))
    data[len(data) // 2] ^= 0x10
    store.put(name, bytes(data))
    with pytest.raises(IntegrityError, match=rf"{name}.*xxh64 digest is [0-9a-f]+ but index.json records"):
        read_all(remote=remote, local=str(tmp_path / "cache"), validate_hash="xxh64")


def test_a_zstd_bomb_is_an_error_naming_the_shard_and_sizes(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write(src, "zstd")
    index = json.loads((src / "index.json").read_text())
    entry = index["shards"][0]
    bomb = zstandard.ZstdCompressor(level=3).compress(bytes(32 << 20))  # 32 MiB of zeros in ~1 KB
    (src / entry["zip_data"]["basename"]).write_bytes(bomb)
    entry["zip_data"].update(bytes=len(bomb), hashes={})
    entry["hashes"] = []
    (src / "index.json").write_text(json.dumps(index, sort_keys=True))
    declared = entry["raw_data"]["bytes"]
    with pytest.raises(CorruptShard, match=rf"{entry['zip_data']['basename']}.*decompresses to more than the "
                                           rf"{declared} bytes index.json records"):
        read_all(remote=str(src), local=str(tmp_path / "cache"))
