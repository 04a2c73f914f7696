"""Issue 26, points 5 and 6: progress of long work in a log, and no lock a killed process leaves behind.

Progress: without a terminal (a log file, CI), `tessera.progress` prints plain lines, no control codes,
checked here through two real commands that use it, `data convert` (items) and a checkpoint load (bytes);
a model download from a bucket folder and `llm export`'s upload use the same WorkProgress, untested here. Locks: every lock file Tessera takes is an flock; a real process takes each one
through the code that takes it in Tessera and is killed with SIGKILL while holding it; the next
command then goes through at once (a non-blocking attempt succeeds, and the real code path runs).
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from tessera.platform import Platform
from tessera.progress import WorkProgress, human_bytes, plain_line

CONTROL = re.compile(r"\x1b|\r")   # ANSI escapes or carriage returns: what a bar leaves in a log


def _log_console() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, width=200), buffer   # a StringIO is no terminal


def test_plain_lines_in_bytes_and_items_without_control_codes() -> None:
    console, buffer = _log_console()
    with WorkProgress("downloading model", console, every=0, unit="bytes", total=4 * 2**20) as progress:
        for _ in range(4):
            progress.advance(2**20)
    lines = buffer.getvalue().splitlines()
    assert not CONTROL.search(buffer.getvalue())
    assert len(lines) == 4   # one per update at every=0, the last at 100%
    pattern = r"downloading model: (\d\.\d) MiB/4\.0 MiB \((\d+\.\d)%\), [\d.]+ [KMG]?i?B/s, \S+ left"
    matches = [re.fullmatch(pattern, line) for line in lines]
    assert all(matches), lines
    assert [m.group(1) for m in matches] == ["1.0", "2.0", "3.0", "4.0"]  # type: ignore[union-attr]
    assert matches[-1].group(2) == "100.0"  # type: ignore[union-attr]


def test_short_work_prints_nothing_and_unknown_totals_end_with_a_line() -> None:
    console, buffer = _log_console()
    with WorkProgress("verifying shards", console, every=3600) as progress:
        progress.update(5, 10)
        progress.update(10, 10)
    assert buffer.getvalue() == ""          # shorter than `every`: no line at all
    with WorkProgress("converting samples", console, every=0) as progress:
        progress.update(1_000)
        progress.update(2_500)
    assert [line.split(", ")[0] for line in buffer.getvalue().splitlines()] == [
        "converting samples: 1,000", "converting samples: 2,500", "converting samples: 2,500"]
    disabled, quiet = _log_console()
    with WorkProgress("rank 1", disabled, every=0, enabled=False) as progress:
        progress.update(1, 1)
    assert quiet.getvalue() == ""


def test_plain_line_formats() -> None:
    assert plain_line("copying", 3 * 2**30, 12 * 2**30, 3.0, "bytes") == \
        "copying: 3.0 GiB/12.0 GiB (25.0%), 1.0 GiB/s, 9s left"
    assert plain_line("converting samples", 12_000, None, 4.0) == "converting samples: 12,000, 3,000/s"
    assert plain_line("verifying shards", 0, 10, 1.0) == "verifying shards: 0/10 (0.0%), 0/s, ? left"
    assert [human_bytes(n) for n in (512, 1536, 5 * 2**40)] == ["512 B", "1.5 KiB", "5.0 TiB"]


def test_a_terminal_gets_a_bar_that_goes_away() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=100)
    with WorkProgress("downloading model", console, unit="bytes", total=100) as progress:
        progress.advance(100)
    assert "\x1b" in buffer.getvalue() and "downloading model" in buffer.getvalue()


def test_data_convert_and_a_checkpoint_load_print_plain_lines_in_a_log(tmp_path: Path, capfd) -> None:  # type: ignore[no-untyped-def]
    """The real commands through the one owner: `data convert` (items) and a checkpoint load (bytes),
    with every=0 so a line comes out at once (the default waits 5 seconds)."""
    import tessera.progress as progress_module
    from tessera.cli.main import app
    from tessera.train.checkpoint import CheckpointManager

    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(300)))
    original = WorkProgress.__init__

    def every_time(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        original(self, *args, **kwargs)
        self.every = 0

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(progress_module.WorkProgress, "__init__", every_time)
        done = CliRunner().invoke(app, ["data", "convert", str(source), str(tmp_path / "mds")])
        assert done.exit_code == 0, done.output
        assert re.search(r"^converting samples: 300, [\d,]+/s$", done.output, re.M), done.output
        import torch

        from tessera.train.time import Timestamp

        with CheckpointManager(tmp_path / "ckpt", async_save=False) as manager:
            manager.save({"model": {"w": torch.arange(1000.0)}}, Timestamp(batch=3))
        capfd.readouterr()
        CheckpointManager(tmp_path / "ckpt").latest()
    err = capfd.readouterr().err
    assert not CONTROL.search(err)
    assert re.search(r"^loading checkpoint ep0-ba3: [\d.]+ KiB/[\d.]+ KiB \(100\.0%\), .* left$", err, re.M), err


# --- locks: a real process killed with SIGKILL while it holds each one ---------------------------------

# Takes every lock file Tessera uses, each through the code that takes it, on one thread apiece; the
# step inside each lock is replaced by a wait that never ends (fault injection), so the process is
# inside all of them when it prints "held" and is killed.
HOLDER = """
import sys, threading
from pathlib import Path
import tessera.llm.hf.fingerprint as fingerprint
import tessera.shards.packed_index as packed_index
from tessera.platform.supervision.supervisor import _try_lock
from tessera.storage import open_store
from tessera.storage.locks import filled_once
from tessera.shards.dataset import read_index
from tessera.stream.cache import ShardCache

work = Path(sys.argv[1])
inside = []

def block(*args, **kwargs):
    inside.append(threading.current_thread().name)
    threading.Event().wait()

def fill(partial):
    (partial / "half.bin").write_bytes(b"x" * 100)
    block()

packed_index.pack = block
fingerprint.file_digest = block
ShardCache._download = block
remote = open_store(str(work / "data"))
entry = read_index(remote).shards[0]
cache = ShardCache(work / "cache", remote, cache_limit=1 << 30)
jobs = {"model cache": lambda: filled_once(work / "models" / "tiny-0123", fill),
        "packed index": lambda: packed_index.open_packed(work / "data" / "index.json", "index", beside=True),
        "shard download": lambda: cache.fetch(entry),
        "base fingerprint": lambda: fingerprint._recorded_digests(work / "model", work / "records" / "m.json")}
for name, job in jobs.items():
    threading.Thread(target=job, name=name, daemon=True).start()
supervisor = _try_lock(work / "home")
while len(inside) < len(jobs):
    threading.Event().wait(0.01)
print("held", sorted(inside), supervisor is not None, flush=True)
threading.Event().wait()
"""


def test_locks_of_a_process_killed_with_sigkill_block_nothing(tmp_path: Path) -> None:
    import fcntl
    import os
    import signal
    import subprocess
    import sys

    from tessera.llm.hf.fingerprint import _recorded_digests, file_digest
    from tessera.platform.supervision.supervisor import supervisor_running
    from tessera.shards import MDSWriter
    from tessera.shards.dataset import read_index
    from tessera.shards.packed_index import open_packed, packed_location
    from tessera.storage import open_store
    from tessera.storage.locks import filled_once
    from tessera.storage.state_folder import state_folder
    from tessera.stream.cache import ShardCache

    with MDSWriter(columns={"text": "str"}, out=str(tmp_path / "data")) as writer:
        for i in range(20):
            writer.write({"text": f"sample {i}"})
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.safetensors").write_bytes(b"weights" * 100)
    (tmp_path / "home").mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        line = holder.stdout.readline()  # type: ignore[union-attr]
        assert line == "held ['base fingerprint', 'model cache', 'packed index', 'shard download'] True\n", \
            line + holder.stderr.read()  # type: ignore[union-attr]
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    assert holder.returncode == -signal.SIGKILL

    index = tmp_path / "data" / "index.json"
    locks = [tmp_path / "models" / ".tiny-0123.lock", packed_location(index, True).with_name("index.packed.lock"),
             tmp_path / "records" / "m.lock", tmp_path / "home" / "supervisor.lock",
             *(state_folder(tmp_path / "cache") / "locks").glob("*.dl")]
    assert len(locks) == 5 and all(p.is_file() for p in locks)   # the killed process left its lock files ...
    for path in locks:                                          # ... and the kernel released every lock
        fd = os.open(path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)       # BlockingIOError if one were still held
        finally:
            os.close(fd)
    assert len(list((tmp_path / "models").glob(".tiny-0123.partial-*"))) == 1   # its half-made folder

    # The next commands go through at once, each through the code that took the lock.
    made = filled_once(tmp_path / "models" / "tiny-0123", lambda partial: (partial / "ok").write_text("1"))
    assert [p.name for p in made.iterdir()] == ["ok"]
    assert list((tmp_path / "models").glob(".tiny-0123.partial-*")) == []   # the dead one's partial removed
    assert int(open_packed(index, "index", beside=True).samples.sum()) == 20
    remote = open_store(str(tmp_path / "data"))
    entry = read_index(remote).shards[0]
    cache = ShardCache(tmp_path / "cache", remote, cache_limit=1 << 30)
    assert cache.fetch(entry).stat().st_size == entry.raw_data.bytes  # type: ignore[union-attr]
    assert list((state_folder(tmp_path / "cache") / "reserved").iterdir()) == []   # its reservation too
    digest = file_digest(tmp_path / "model" / "model.safetensors")
    assert _recorded_digests(tmp_path / "model", tmp_path / "records" / "m.json") == {"model.safetensors": digest}
    assert not supervisor_running(tmp_path / "home")


# --- tessera run metrics NAME --plot ------------------------------------------------------------------

CURVES = """
import json, math, os
with open(os.environ["TESSERA_METRICS"], "a") as f:
    for step in range(1, 31):
        row = {"step": step, "loss/train": 0.6 + 3.5 * math.exp(-step / 9), "lr": 3e-4 * min(1, step / 6)}
        f.write(json.dumps({**row, **({"loss/eval": row["loss/train"] + 0.1} if step % 10 == 0 else {})}) + "\\n")
"""


def test_run_metrics_plot_draws_the_loss_and_lr_curves_of_a_real_run(platform: Platform, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A run on the local cluster reports 30 steps; `tessera run metrics NAME --plot` in a pipe draws both
    charts as plain text (no colour codes), the table and --json give the same rows."""
    import sys
    import time

    from tessera.cli.main import app

    monkeypatch.setenv("COLUMNS", "100")
    script = tmp_path / "curves.py"
    script.write_text(CURVES)
    platform.create_run({"name": "curves", "command": f"{sys.executable} {script}",
                         "compute": {"cluster": "local", "procs_per_node": 1}})
    platform.wait_for_run_status("curves", "COMPLETED", timeout=60)
    deadline = time.monotonic() + 30
    while len(platform.run_metrics("curves")[0]) < 30 and time.monotonic() < deadline:
        time.sleep(0.1)
    runner = CliRunner()
    drawn = runner.invoke(app, ["run", "metrics", "curves", "--plot"])
    assert drawn.exit_code == 0, drawn.output
    assert not CONTROL.search(drawn.output)
    lines = drawn.output.splitlines()
    assert lines[0].strip() == "loss" and "learning rate" in [line.strip() for line in lines]
    assert sum("loss/train" in line for line in lines) == 1 and sum("loss/eval" in line for line in lines) == 1
    assert re.search(r"^\s*1\.0\s.*\s30\.0\s*$", drawn.output, re.M)        # the step axis: 1 to 30
    assert re.search(r"^0\.000300┤", drawn.output, re.M)                       # the lr axis tops at 3e-4
    assert sum(ch in "⠀⣿" or "\u2800" <= ch <= "\u28ff" for ch in drawn.output) > 60   # braille curves
    assert max(len(line) for line in lines) <= 100
    listed = runner.invoke(app, ["run", "metrics", "curves", "--last", "3"])
    assert listed.output.splitlines() == ["step  loss/train      lr  loss/eval",
                                          "  28      0.7559  0.0003",
                                          "  29      0.7395  0.0003",
                                          "  30      0.7249  0.0003     0.8249"]
    rows = [json.loads(line) for line in runner.invoke(app, ["run", "metrics", "curves", "--json"]).output.splitlines()]
    assert [row["step"] for row in rows] == list(range(1, 31))
