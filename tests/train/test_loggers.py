"""The progress logger's ETA: measured from where this process started, so a resume does not shrink it."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest

from tessera.train import loggers
from tessera.train.loggers import ProgressLogger, RunInfo, eta_seconds


def test_eta_of_a_fresh_run_extrapolates_the_whole_run():
    assert eta_seconds(elapsed=60.0, start_progress=0.0, progress=0.25) == pytest.approx(180.0)


def test_eta_after_a_resume_uses_this_process_rate():
    # Resumed at 90%; 60 s later at 91%: 1% per minute, so 9 minutes are left (not 60 s x 0.09 / 0.91).
    assert eta_seconds(elapsed=60.0, start_progress=0.90, progress=0.91) == pytest.approx(540.0)


@pytest.mark.parametrize(("start", "now"), [(0.0, 0.0), (0.5, 0.5), (0.6, 0.5)])
def test_no_eta_before_this_process_made_progress(start, now):
    assert eta_seconds(elapsed=10.0, start_progress=start, progress=now) is None


def test_eta_is_never_negative_past_the_end():
    assert eta_seconds(elapsed=10.0, start_progress=0.5, progress=1.2) == 0.0


def test_progress_lines_print_the_eta_of_a_resumed_run(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(loggers, "time", SimpleNamespace(monotonic=lambda: now[0]))
    out = io.StringIO()
    logger = ProgressLogger(stream=out)
    logger.start(RunInfo("resumed", start_progress=0.9))
    now[0] += 60.0
    logger.log_metrics({"train/loss": 1.0, "time/progress": 0.91}, step=91)
    assert out.getvalue().rstrip().endswith("eta 540s")
