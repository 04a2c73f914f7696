"""A remote stream's index.json is downloaded once per node (stream/index_fetch.py): by the first of the
node's processes while the others wait and then use it; a later start with an unchanged remote downloads
nothing, a rewritten one is downloaded again (its cached copy kept when the bytes are the same)."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from tessera.shards import ShardWriter
from tessera.stream import StreamingDataset, index_fetch


def _write(remote: Path | str, n: int) -> None:
    with ShardWriter(remote, {"id": "int"}, size_limit=400, mode="overwrite") as writer:
        for i in range(n):
            writer.write({"id": i})


def _samples(remote_and_cache: tuple[str, str]) -> int:
    remote, cache = remote_and_cache
    return StreamingDataset(remote=remote, local=cache, batch_size=4).num_samples


def test_index_json_is_downloaded_once_per_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four ranks of a node starting together, as torchrun starts them: fresh processes, not fork()s of this
    one (a fork of a test process that earlier tests left with threads may inherit a held lock)."""
    remote, cache, log = tmp_path / "remote", tmp_path / "cache", tmp_path / "downloads"
    _write(remote, 100)
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["tessera.stream"])
    with context.Pool(4, _count_downloads, (str(log),)) as pool:
        assert pool.map(_samples, [(str(remote), str(cache))] * 4) == [100] * 4
    assert len(log.read_text().splitlines()) == 1
    monkeypatch.setattr(index_fetch, "download_from", index_fetch.download_from)  # restored after the test
    _count_downloads(str(log))  # this process, a rank starting later
    assert _samples((str(remote), str(cache))) == 100  # a later start, the remote unchanged: no download
    assert len(log.read_text().splitlines()) == 1
    cached = cache / "index.json"
    inode = cached.stat().st_ino
    os.utime(remote / "index.json", (1e9, 1e9))  # rewritten with the same bytes: fetched, the copy kept
    assert _samples((str(remote), str(cache))) == 100
    assert len(log.read_text().splitlines()) == 2 and cached.stat().st_ino == inode
    _write(remote, 130)  # a new dataset in its place
    assert _samples((str(remote), str(cache))) == 130
    assert len(log.read_text().splitlines()) == 3


def _count_downloads(log: str, env: dict[str, str] | None = None) -> None:
    """Pool initializer of a spawned rank: log each index.json download of this process (pid per line).
    `env`: the S3 settings, given explicitly: a forkserver that an earlier test started has the
    environment of then, not this test's."""
    os.environ.update(env or {})
    download = index_fetch.download_from

    def counted(*args: object, **kwargs: object) -> int:
        with open(log, "a") as out:
            out.write(f"{os.getpid()}\n")
        return download(*args, **kwargs)

    index_fetch.download_from = counted


def test_index_json_on_s3_is_downloaded_once_per_node(s3_bucket: str, s3_env: dict[str, str], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The same with an object store's HEAD (etag, last modified) naming the remote object, and ranks that
    are not fork()ed from this process (forkserver: none inherits its obstore runtime or its patches)."""
    remote, cache, log = f"{s3_bucket}/ds", tmp_path / "cache", tmp_path / "downloads"
    _write(remote, 100)
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["tessera.stream"])  # (imported once by the server, if it starts here)
    with context.Pool(4, _count_downloads, (str(log), s3_env)) as pool:
        assert pool.map(_samples, [(remote, str(cache))] * 4) == [100] * 4
    assert len(log.read_text().splitlines()) == 1
    monkeypatch.setattr(index_fetch, "download_from", index_fetch.download_from)  # restored after the test
    _count_downloads(str(log))  # this process, a rank starting later
    assert _samples((remote, str(cache))) == 100  # a later start, the remote unchanged: no download
    assert len(log.read_text().splitlines()) == 1
    _write(remote, 130)  # a new dataset in its place: a new etag
    assert _samples((remote, str(cache))) == 130
    assert len(log.read_text().splitlines()) == 2
