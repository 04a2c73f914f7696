"""Where metrics go: a console progress bar, a JSONL file, TensorBoard. Rank 0 logs; other ranks don't.

    Trainer(..., loggers=["progress", "jsonl", "tensorboard"], log_dir="logs/{run_name}")

Each logger gets `start(run)`, `log_metrics(metrics, step)` for every logged batch and eval, `flush()`
after each committed checkpoint (on the save thread) and at the end, then `close()`. File loggers write
under `log_dir` and, when the run has a save folder, copy their files to `<save_folder>/logs/` on each
flush, so the metrics of a run live next to its checkpoints in the bucket. A resumed run on a fresh
machine first downloads the bucket's JSONL file and appends to it; a step logged twice (after a resume
from an older checkpoint) keeps both lines, and readers take the last one.

Experiment trackers (MLflow, Weights & Biases) are loggers too (train/trackers/, docs/trackers.md), named
or configured like these (train/logger_settings.py). When `TESSERA_METRICS` names a file (the platform
sets it for every run), rank 0 also writes the run's metrics stream there: the JSONL lines with the keys
the console plots (`console_row`).
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tessera.storage import NotFound, Store
from tessera.train.logger_base import METRICS_ENV, METRICS_FILE, Logger, RunInfo
from tessera.train.logger_settings import (
    LOGGERS,
    JSONLSettings,
    LoggerSettings,
    ProgressSettings,
    TensorBoardSettings,
    parse_loggers,
)

__all__ = ["JSONLLogger", "LOGGERS", "METRICS_ENV", "Logger", "MetricsStreamLogger", "ProgressLogger", "RunInfo",
           "TensorBoardLogger", "console_row", "eta_seconds", "make_loggers"]


class ProgressLogger(Logger):
    """A rich progress bar (step, loss, tokens/s, ETA) on a terminal; a plain line every `every` logged
    batches otherwise (batch logs, CI). Eval results are always printed."""

    def __init__(self, every: int = 1, stream: Any = None) -> None:
        self.every, self.stream = max(1, every), stream or sys.stderr
        self._progress: Any = None
        self._task: Any = None
        self._count = 0
        self._start = time.monotonic()
        self._start_progress = 0.0

    def start(self, run: RunInfo) -> None:
        self._start, self._start_progress = time.monotonic(), run.start_progress
        if getattr(self.stream, "isatty", lambda: False)():
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self._progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                      TextColumn("{task.percentage:>5.1f}%"), TextColumn("{task.fields[info]}"),
                                      TimeElapsedColumn(), TimeRemainingColumn(),
                                      console=Console(file=self.stream))
            # Starting at the resumed fraction keeps rich's rate (hence its ETA) to this process's progress.
            self._task = self._progress.add_task(run.run_name or "train", total=1.0, completed=run.start_progress,
                                                 info="")
            self._progress.start()

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if "summary/time/train_sec" in metrics:  # the Trainer's figures for the whole run, at its end
            self._print(f"[summary] {_run_summary(metrics)}")
            return
        if "icl/average" in metrics:  # in-context-learning scores (a callback's): a line like eval's
            self._print(f"[icl] step {step} | " + " | ".join(f"{k.removeprefix('icl/')} {v:.3f}"
                                                             for k, v in metrics.items() if k != "icl/seconds"))
            return
        info = _summary(metrics, step)
        if any(k.startswith("eval/") for k in metrics):
            self._print(f"[eval] {info}")
            return
        if "train/loss" not in metrics:  # e.g. a checkpoint's stall figure: for the JSONL log only
            return
        fraction = metrics.get("time/progress")
        if self._progress is not None:
            self._progress.update(self._task, completed=min(fraction or 0.0, 1.0), info=info)
            return
        self._count += 1
        if self._count == 1 or self._count % self.every == 0:
            remaining = None if fraction is None else eta_seconds(time.monotonic() - self._start,
                                                                   self._start_progress, fraction)
            eta = "" if remaining is None else f" eta {remaining:,.0f}s"
            self._print(f"[train] {info}{eta}")

    def _print(self, line: str) -> None:
        if self._progress is not None:
            self._progress.console.print(line, markup=False, highlight=False)
        else:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def eta_seconds(elapsed: float, start_progress: float, progress: float) -> float | None:
    """Seconds left at this process's rate: `elapsed` seconds took the run from `start_progress` to
    `progress` (fractions of the whole run), so the rest takes elapsed / (progress - start_progress) x
    (1 - progress). Measuring from where this process started matters after a resume: the whole run's
    progress over this process's time would promise the last tenth of a run in seconds. None until
    this process has made progress."""
    done = progress - start_progress
    if done <= 0:
        return None
    return elapsed / done * max(0.0, 1.0 - progress)


def _summary(metrics: dict[str, float], step: int) -> str:
    parts = [f"step {step}"]
    for key, label, fmt in (("train/loss", "loss", ".4f"), ("eval/loss", "loss", ".4f"),
                            ("throughput/tokens_per_sec", "tok/s", ",.0f"),
                            ("throughput/samples_per_sec", "sp/s", ",.1f"), ("throughput/mfu", "mfu", ".1%")):
        if key in metrics:
            parts.append(f"{label} {metrics[key]:{fmt}}")
    parts += [f"{k.removeprefix('eval/')} {v:.4g}" for k, v in metrics.items()
              if k.startswith("eval/") and k != "eval/loss"]
    return " | ".join(parts)


def _run_summary(metrics: dict[str, float]) -> str:
    """tokens/s, MFU, the step-time breakdown and the memory peak of a run, from its summary/ figures."""
    m = {k.removeprefix("summary/"): v for k, v in metrics.items()}
    parts = [f"{m['time/train_sec']:,.1f}s training"]
    for key, label, fmt in (("throughput/tokens_per_sec", "tok/s", ",.0f"), ("throughput/samples_per_sec", "sp/s",
                            ",.1f"), ("throughput/mfu", "mfu", ".1%")):
        if key in m:
            parts.append(f"{label} {m[key]:{fmt}}")
    if m.get("time/step_sec"):
        step = m["time/step_sec"]
        shares = "/".join(f"{m.get(f'time/{k}_sec', 0.0) / step:.0%}"
                          for k in ("data_wait", "forward_backward", "optimizer", "other"))
        parts.append(f"step {step * 1e3:,.1f} ms (data/fwd+bwd/opt/other {shares})")
    peak = m.get("memory/allocated_peak_gb", m.get("memory/rss_peak_gb"))
    if peak is not None:
        parts.append(f"memory peak {peak:.2f} GB" + (" (RSS)" if "memory/rss_peak_gb" in m else ""))
    return " | ".join(parts)


class JSONLLogger(Logger):
    """One JSON object per line: {"step": ..., metric: value, ...} in `<log_dir>/metrics.jsonl`."""

    FILENAME = METRICS_FILE

    def __init__(self, path: str | os.PathLike[str] | None = None, *, console_keys: bool = False) -> None:
        self.path = Path(path) if path is not None else None
        self.console_keys = console_keys  # rows as the metrics stream has them (console_row)
        self.remote: Store | None = None
        self._file: Any = None
        self._lock = threading.Lock()

    def start(self, run: RunInfo) -> None:
        self.path = self.path or run.log_dir / self.FILENAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.remote = run.remote
        if self.remote is not None and not self.path.exists():  # resuming on another machine
            try:
                self.path.write_bytes(self.remote.get(self.path.name))
            except NotFound:
                pass
        # Line-buffered: every logged line reaches the OS at once, so a kill -9 loses none of them.
        self._file = open(self.path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 (closed in close())

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        row = console_row(metrics) if self.console_keys else metrics
        line = json.dumps({"step": step, **row}, allow_nan=not self.console_keys)
        with self._lock:
            self._file.write(line + "\n")

    def flush(self) -> None:
        if self._file is None:
            return
        with self._lock:
            self._file.flush()
            data = self.path.read_bytes() if self.remote is not None else None
        if data is not None and self.remote is not None:
            self.remote.put(self.path.name, data)

    def close(self) -> None:
        if self._file is not None:
            self.flush()
            self._file.close()
            self._file = None


class TensorBoardLogger(Logger):
    """Scalars to TensorBoard event files under `<log_dir>/tensorboard` (needs `pip install tensorboard`)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ImportError("loggers=['tensorboard'] needs the tensorboard package: `pip install tensorboard` "
                              "(or drop 'tensorboard' from loggers)") from None
        self._writer_cls = SummaryWriter
        self.path = Path(path) if path is not None else None
        self.remote: Store | None = None
        self._writer: Any = None

    def start(self, run: RunInfo) -> None:
        self.path = self.path or run.log_dir / "tensorboard"
        self.remote = run.remote.child("tensorboard") if run.remote is not None else None
        self._writer = self._writer_cls(log_dir=str(self.path))

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, global_step=step)

    def flush(self) -> None:
        if self._writer is None:
            return
        self._writer.flush()
        if self.remote is not None and self.path is not None:
            for file in sorted(self.path.rglob("*")):
                if file.is_file():
                    self.remote.put_file(file.relative_to(self.path).as_posix(), file)

    def close(self) -> None:
        if self._writer is not None:
            self.flush()
            self._writer.close()
            self._writer = None


# The trainer's keys the metrics stream renames to the platform's names (docs/trackers.md).
CONSOLE_KEYS = {"train/loss": "loss/train", "eval/loss": "loss/eval", "lr/opt0": "lr"}


def console_row(metrics: dict[str, float]) -> dict[str, Any]:
    """A metrics stream row: the trainer's metrics with the loss and the learning rate under the platform's
    names (renamed, not copied: the console plots every loss-like key, so a copy would draw each line
    twice), and NaN or infinity as null (strict JSON: a browser's JSON.parse refuses NaN)."""
    return {CONSOLE_KEYS.get(k, k): None if isinstance(v, float) and not math.isfinite(v) else v
            for k, v in metrics.items()}


class MetricsStreamLogger(JSONLLogger):
    """The platform's metrics file (`$TESSERA_METRICS`): JSONL rows with the platform's keys, appended for
    the whole run (a resumed run continues the file; a step logged twice: the last line counts). Local
    only: no copy to the save folder, where the run's own metrics.jsonl goes. When a JSONL logger of the
    run already writes that file, that logger writes the platform's keys and this one stays silent, so no
    line is written twice."""

    def __init__(self, path: str | os.PathLike[str], siblings: list[JSONLLogger]) -> None:
        super().__init__(path, console_keys=True)
        self._siblings = siblings

    def start(self, run: RunInfo) -> None:  # started after its siblings (make_loggers appends it last)
        assert self.path is not None
        for sibling in self._siblings:
            if sibling.path is not None and os.path.abspath(sibling.path) == os.path.abspath(self.path):
                sibling.console_keys = True
                return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 (closed in close())

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self._file is not None:
            super().log_metrics(metrics, step)


def _build(settings: LoggerSettings) -> Logger:
    if isinstance(settings, ProgressSettings):
        return ProgressLogger(every=settings.every)
    if isinstance(settings, JSONLSettings):
        return JSONLLogger(settings.path)
    if isinstance(settings, TensorBoardSettings):
        return TensorBoardLogger(settings.path)
    return settings.build()  # a tracker: its module (not its library) is imported now


def make_loggers(specs: Any, environ: dict[str, str] | None = None) -> list[Logger]:
    """Loggers from names, `{name: settings}` items and/or Logger instances (logger_settings.parse_loggers),
    plus the platform's metrics stream when `$TESSERA_METRICS` is set."""
    out = [item if isinstance(item, Logger) else _build(LOGGERS[item]() if isinstance(item, str) else item)
           for item in parse_loggers(specs)]
    stream = (os.environ if environ is None else environ).get(METRICS_ENV, "")
    if stream:
        out.append(MetricsStreamLogger(stream, [lg for lg in out if isinstance(lg, JSONLLogger)]))
    return out
