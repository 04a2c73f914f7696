"""The behaviours a MosaicML Streaming user relies on, as MosaicML's own tests check them
(benchmarks/streaming_own_tests.py runs those): each test here pins one of them down exactly, on small
data, in-process."""

from __future__ import annotations

import os
from pathlib import Path

import helpers

from tessera.storage.state_folder import state_folder
from tessera.stream import StreamingDataLoader, StreamingDataset


def test_local_holds_exactly_what_remote_holds(tmp_path: Path) -> None:
    """Tessera's locks, stamps, journal and packed index live beside `local`, not in it."""
    remote, local = tmp_path / "remote", tmp_path / "local"
    helpers.write_elastic(remote, range(300), size_limit=600)
    ds = StreamingDataset(remote=str(remote), local=str(local), batch_size=4, shuffle=True)
    ids = [int(i) for batch in StreamingDataLoader(ds, batch_size=4, num_workers=2) for i in batch["id"]]
    assert sorted(ids) == list(range(300))
    assert sorted(os.listdir(local)) == sorted(os.listdir(remote))
    assert state_folder(local) == tmp_path / ".local.tessera"
    assert {p.name for p in state_folder(local).iterdir()} >= {"index.packed", "locks", "stamps", "downloads.log"}


def test_a_cache_with_the_state_inside_keeps_it_there(tmp_path: Path) -> None:
    """A cache folder an earlier Tessera filled (state in `local/.tessera`) is used as it is: its shards
    are not downloaded again, and processes of both versions keep sharing its locks."""
    remote, local = tmp_path / "remote", tmp_path / "local"
    helpers.write_elastic(remote, range(100), size_limit=600)
    (local / ".tessera").mkdir(parents=True)
    assert state_folder(local) == local / ".tessera"
    assert {int(s["id"]) for s in StreamingDataset(remote=str(remote), local=str(local), batch_size=4)} == set(range(100))
    assert not (tmp_path / ".local.tessera").exists()
    assert (local / ".tessera" / "downloads.log").is_file()
