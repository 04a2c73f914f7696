"""`tessera data repair` after a `tessera data convert` killed with SIGKILL mid-write.

The shard files of a killed conversion are only a prefix of the data, and an index rebuilt from them
looks like a complete dataset. Repair must say the write was interrupted, list what is complete, point
at `--mode resume`, exit non-zero and commit nothing; `--allow-partial` commits the prefix (in order),
and the write can still be resumed afterwards to the whole dataset.
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
from shard_helpers import read_json
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.shards import MDSDataset
from tessera.shards.interrupted import InterruptedWrite
from tessera.shards.repair import repair_index
from tessera.shards.session import JOURNAL_BASENAME

TESSERA = str(Path(sys.executable).parent / "tessera")
N = 24_000
# brotli at quality 11 is slow (about 1 MB/s), so the conversion is still running when its journal
# first names a shard (the writer journals at most once a second): that is when the test kills it.
OPTIONS = ["--columns", "id:int,text:str", "--compression", "br:11", "--size-limit", "16kb"]
runner = CliRunner()


def jsonl(path: Path) -> Path:
    with open(path, "w") as f:
        for i in range(N):
            f.write(json.dumps({"id": i, "text": f"line {i}: " + "lorem ipsum dolor " * (i % 9)}) + "\n")
    return path


def convert_and_kill(src: Path, out: Path) -> dict:
    """Run the real CLI conversion and SIGKILL it once its journal confirms a shard; returns the journal."""
    proc = subprocess.Popen([TESSERA, "data", "convert", str(src), str(out), *OPTIONS],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    journal = out / JOURNAL_BASENAME
    deadline = time.monotonic() + 120
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                if read_json(journal)["shards"]:
                    break
            except (FileNotFoundError, json.JSONDecodeError):
                pass
            time.sleep(0.01)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, f"the conversion ended before it could be killed: {err!r}"
    return read_json(journal)


def test_repair_refuses_a_killed_convert_then_allows_a_partial_index_then_resume_finishes(tmp_path: Path) -> None:
    src, out = jsonl(tmp_path / "in.jsonl"), tmp_path / "out"
    journal = convert_and_kill(src, out)
    confirmed = len(journal["shards"])
    samples = sum(e["samples"] for e in journal["shards"])
    files = len(list(out.glob("shard.*.mds.br")))
    assert not (out / "index.json").exists()

    res = runner.invoke(app, ["data", "repair", str(out)])
    assert res.exit_code == 1
    lines = res.output.splitlines()
    assert lines[0] == (f"error: {out}: a write was interrupted ({JOURNAL_BASENAME} is present); "
                        "nothing was committed")
    assert lines[1] == (f"  complete: {confirmed} shards confirmed, {samples:,} samples, the last "
                        f"{journal['shards'][-1]['raw_data']['basename']}; {files} shard files stored")
    assert lines[2].startswith(f"  to finish: tessera data convert INPUT {out} --mode resume")
    assert "--allow-partial" in lines[3]
    assert not (out / "index.json").exists()
    with pytest.raises(InterruptedWrite, match="--mode resume"):
        repair_index(out, dry_run=True)

    res = runner.invoke(app, ["data", "repair", str(out), "--allow-partial"])
    assert res.exit_code == 0, res.output
    partial = read_json(out / "index.json")["shards"]
    kept = sum(e["samples"] for e in partial)
    assert f"rebuilt a PARTIAL index.json: {len(partial)} shards, {kept:,} samples" in res.output
    assert samples <= kept < N
    assert [int(s["id"]) for s in MDSDataset(out, cache_dir=tmp_path / "c1")] == list(range(kept))
    assert (out / JOURNAL_BASENAME).exists()  # kept, so the write can still be finished

    res = runner.invoke(app, ["data", "convert", str(src), str(out), *OPTIONS, "--mode", "resume"])
    assert res.exit_code == 0, res.output
    assert not (out / JOURNAL_BASENAME).exists()
    assert [int(s["id"]) for s in MDSDataset(out, cache_dir=tmp_path / "c2")] == list(range(N))
    assert runner.invoke(app, ["data", "verify", str(out), "--quick"]).exit_code == 0
