"""Ctrl-C during `tessera train` keeps the work (docs/training.md, "Stopping a run"): a real process of
tiny-cpu.yaml, with a DataLoader worker, gets SIGINT in its whole process group as a terminal sends it. It
saves a checkpoint of the step reached, exits 130, and the same command resumes from that checkpoint and
finishes. A second Ctrl-C ends the process at once, without a checkpoint.

No timing is assumed: the test reads the run's log through a pipe of one page and stops reading before it
signals, so the run is stopped (blocked writing its log) at a step it cannot leave until the test reads on.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from llm_helpers import write_text_corpus
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.storage import open_store

TESSERA = str(Path(sys.executable).with_name("tessera"))
STEPS = 100  # more than the steps a page of log lines holds, so the signal always comes first
STEP_LINE = re.compile(rb"^\[train\] step (\d+) ", re.MULTILINE)
NOTICE = b"Ctrl-C: stopping after this step with a checkpoint"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sigint")
    write_text_corpus(root / "corpus", 40)
    res = CliRunner().invoke(app, ["llm", "prep", str(root / "corpus"), str(root / "data"), "--tokenizer", "byte",
                                   "--seq-len", "32", "--val-fraction", "0.2"])
    assert res.exit_code == 0, res.output
    return root / "data"


def command(data: Path, save: Path) -> list[str]:
    return [TESSERA, "train", "tiny-cpu.yaml", "model.d_model=32", "model.n_layers=1", "model.max_seq_len=32",
            "global_train_batch_size=4", "device_train_microbatch_size=4", "torch_threads=1",
            "scheduler.t_warmup=4ba", "log_interval=1ba", "loggers=[progress]", "save_interval=1000ba",
            "eval_interval=1000ba", "data.eval.max_batches=2", "data.train.num_workers=1",
            f"max_duration={STEPS}ba", f"data.train.streams.0.remote={data}", f"data.eval.streams.0.remote={data}",
            f"save_folder={save}"]


def checkpoints(save: Path) -> list[str]:
    return sorted(p.name for p in save.glob("ep*")) if save.exists() else []


class Run:
    """`tessera train` in a session of its own (so a signal to its group is a terminal's Ctrl-C), its log
    (stderr) on a pipe of one page read a byte at a time: the run cannot get further than a page of log
    lines past what the test has read."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        self.proc = subprocess.Popen(args, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, bufsize=0,
                                     start_new_session=True)
        assert self.proc.stderr is not None
        self.pipe = self.proc.stderr
        self.capacity = fcntl.fcntl(self.pipe.fileno(), fcntl.F_SETPIPE_SZ, 4096)
        self.log = b""

    def read_until_step(self, step: int) -> None:
        while not re.search(rb"^\[train\] step %d " % step, self.log, re.MULTILINE):
            line = self.pipe.readline()
            assert line, f"the run ended before step {step} (exit {self.proc.wait()}):\n{self.log[-3000:]!r}"
            self.log += line

    def wait_blocked(self) -> None:
        """Until the pipe is full: the run waits in a write of its log (a log line is < 200 bytes)."""
        unread = bytearray(4)
        while int.from_bytes(unread, sys.byteorder) < self.capacity - 200:
            assert self.proc.poll() is None, f"the run ended (exit {self.proc.returncode}):\n{self.log[-3000:]!r}"
            fcntl.ioctl(self.pipe.fileno(), termios.FIONREAD, unread)
            time.sleep(0.01)

    def ctrl_c(self) -> None:
        os.killpg(self.proc.pid, signal.SIGINT)  # the whole group, the DataLoader worker included

    def sigint_caught(self) -> bool:
        """Whether the run still has a handler for SIGINT (/proc: the SigCgt mask)."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        caught = int(re.search(r"^SigCgt:\s*([0-9a-f]+)", status, re.MULTILINE)[1], 16)
        return bool(caught & (1 << (signal.SIGINT - 1)))

    def finish(self) -> int:
        self.log += self.pipe.read()
        return self.proc.wait(timeout=60)

    def steps(self) -> list[int]:
        return [int(n) for n in STEP_LINE.findall(self.log)]


def test_ctrl_c_saves_the_step_reached_exits_130_and_the_same_command_resumes(data: Path, tmp_path: Path) -> None:
    save = tmp_path / "ckpt"
    run = Run(command(data, save), tmp_path)
    run.read_until_step(3)
    run.wait_blocked()
    run.ctrl_c()
    assert run.finish() == 130, run.log[-3000:]
    reached = run.steps()[-1]  # the last step the run logged
    assert 3 < reached < STEPS
    assert run.log.count(NOTICE) == 1
    assert b"Traceback" not in run.log
    store = open_store(save)
    stopped_at = store.get("latest").decode()  # epN-baM: 46 batches an epoch
    assert re.fullmatch(rf"ep\d-ba{reached}", stopped_at) and checkpoints(save) == [stopped_at]

    again = subprocess.run(command(data, save), cwd=tmp_path, capture_output=True, timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert re.search(rb"resumed from \S*/%s\b" % stopped_at.encode(), again.stderr), again.stderr[-3000:]
    assert [int(n) for n in STEP_LINE.findall(again.stderr)] == list(range(reached + 1, STEPS + 1))
    assert re.fullmatch(rf"ep\d-ba{STEPS}", store.get("latest").decode())


def test_a_second_ctrl_c_aborts_at_once_without_a_checkpoint(data: Path, tmp_path: Path) -> None:
    save = tmp_path / "ckpt"
    run = Run(command(data, save), tmp_path)
    run.read_until_step(3)
    run.wait_blocked()  # the run cannot reach its checkpoint: it waits for the test to read its log
    run.ctrl_c()
    while run.sigint_caught():  # the first Ctrl-C is handled: SIGINT has its default action again
        assert run.proc.poll() is None
        time.sleep(0.01)
    run.ctrl_c()
    assert run.finish() == -signal.SIGINT
    assert checkpoints(save) == []
