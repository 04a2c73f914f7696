"""Sample orders of small datasets under several settings, recorded once (before issue 24 changed how
index.json is loaded) into data/order_golden.json, so that a change in how the index is read or the
plan is built can be checked to give exactly the same order for the same seed.

Run as a script to record the orders again (only when the plan is meant to change):
`python tests/stream/order_cases.py` (writes tests/stream/data/order_golden.json).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from helpers import write_elastic

from tessera.stream import Stream, StreamingDataLoader, StreamingDataset

GOLDEN = Path(__file__).resolve().parent / "data" / "order_golden.json"


def write_data(root: Path) -> Path:
    """Three small datasets: 600 samples (~20 shards), 240 and 90 (for the weighted mix)."""
    write_elastic(root / "one", range(600))
    write_elastic(root / "A", range(240))
    write_elastic(root / "B", range(10_000, 10_090), size_limit=1100)
    return root


def _ids(samples: Any) -> list[int]:
    return [int(s["id"]) for s in samples]


def _loader_ids(ds: StreamingDataset, workers: int, batches: int | None = None) -> list[int]:
    out: list[int] = []
    loader = StreamingDataLoader(ds, batch_size=ds.batch_size, num_workers=workers)
    for i, batch in enumerate(loader):
        if batches is not None and i == batches:
            break
        out += np.asarray(batch["id"]).reshape(-1).tolist()
    return out


def orders(root: Path) -> dict[str, list[int]]:
    """Each case's sample ids, in the order they are read."""
    one = str(root / "one")
    mix = [Stream(local=str(root / "A"), proportion=0.7), Stream(local=str(root / "B"), proportion=0.3)]
    out: dict[str, list[int]] = {}
    out["plain"] = _ids(StreamingDataset(local=one, batch_size=8))
    out["shuffled"] = _ids(StreamingDataset(local=one, batch_size=8, shuffle=True))
    ds = StreamingDataset(local=one, batch_size=4, shuffle=True, shuffle_seed=7, num_canonical_nodes=4,
                          shuffle_block_size=50)
    out["lanes4_epoch0"] = _ids(ds)
    out["lanes4_epoch1"] = _ids(ds)
    out["naive"] = _ids(StreamingDataset(local=one, batch_size=8, shuffle=True, shuffle_algo="naive"))
    out["mix"] = _ids(StreamingDataset(streams=mix, batch_size=8, shuffle=True, epoch_size=500))
    mix2 = [Stream(local=str(root / "A"), repeat=1.5), Stream(local=str(root / "B"), choose=40)]
    out["mix_stratified"] = _ids(StreamingDataset(streams=mix2, batch_size=10, shuffle=True,
                                                  batching_method="stratified"))
    ds = StreamingDataset(local=one, batch_size=8, shuffle=True, shuffle_seed=11)
    loader = StreamingDataLoader(ds, batch_size=8)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    del it
    resumed = StreamingDataset(local=one, batch_size=8, shuffle=True, shuffle_seed=11)
    resumed.load_state_dict(state)
    out["resumed_after_5"] = _ids(resumed)
    out["workers2"] = _loader_ids(StreamingDataset(local=one, batch_size=8, shuffle=True, shuffle_seed=5), 2)
    return out


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        found = orders(write_data(Path(tmp)))
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(found, separators=(",", ":")) + "\n")
    print({k: len(v) for k, v in found.items()}, file=sys.stderr)
