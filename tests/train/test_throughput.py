"""Throughput metrics while training: logged at log points with the step-time breakdown and memory, summarised
at the end, and no read-back of a device value by the loop between log points."""

from __future__ import annotations

import io
import sys
import time
from typing import Any

import pytest
import torch

from tessera.train import Callback, Trainer
from tessera.train.loggers import Logger, ProgressLogger
from tessera.train.throughput import Throughput

TOKENS, VOCAB = 16, 32


class TinyLM(torch.nn.Module):
    flops_per_token = 6 * (VOCAB * 16 + 16 * VOCAB)

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.out = torch.nn.Embedding(VOCAB, 16), torch.nn.Linear(16, VOCAB)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        tokens = batch["tokens"]
        logits = self.out(self.emb(tokens[:, :-1]))
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


class Recording(Logger):
    def __init__(self) -> None:
        self.lines: list[tuple[int, dict[str, float]]] = []

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.lines.append((step, dict(metrics)))


class Steps(Callback):
    def __init__(self) -> None:
        self.done = 0
        self.step_times: list[float] = []

    def on_batch_end(self, trainer: Any, metrics: dict[str, Any]) -> None:
        self.done = trainer.timestamp.batch
        self.step_times.append(metrics["step_time"])


def loader(batches: int = 12, batch_size: int = 4) -> torch.utils.data.DataLoader:
    gen = torch.Generator().manual_seed(0)
    rows = torch.randint(0, VOCAB, (batches * batch_size, TOKENS + 1), generator=gen)
    return torch.utils.data.DataLoader([{"tokens": r} for r in rows], batch_size=batch_size)


READ_BACKS = ("item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__")


def test_no_read_back_between_log_points_and_metrics_at_them(monkeypatch):
    """Every read of a tensor's value made by Tessera's own code (not torch's optimizer, not the test's
    model) is counted with the step it happened in: only log points (every 5th batch) and the end may read."""
    steps = Steps()
    reads: list[tuple[int, str, str]] = []
    for name in READ_BACKS:
        original = getattr(torch.Tensor, name)

        def counting(self: torch.Tensor, *args: Any, __name: str = name, __original: Any = original) -> Any:
            caller = sys._getframe(1).f_code.co_filename
            if "/tessera/" in caller and "/tests/" not in caller:
                reads.append((steps.done + 1, __name, f"{caller}:{sys._getframe(1).f_lineno}"))
            return __original(self, *args)

        monkeypatch.setattr(torch.Tensor, name, counting)
    torch.manual_seed(0)
    model = TinyLM()
    recording = Recording()
    trainer = Trainer(model, torch.optim.AdamW(model.parameters(), lr=1e-3), train_dataloader=loader(),
                      max_duration="12ba", log_interval="5ba", loggers=[recording], callbacks=[steps],
                      grad_clip_norm=1.0, device="cpu")
    trainer.fit()
    trainer.close()
    between = [r for r in reads if r[0] % 5 and r[0] <= 12]
    assert not between, f"read-backs between log points: {between}"
    assert {r[0] for r in reads} & {5, 10}, "the log points read the loss"

    logged = {step: m for step, m in recording.lines if "train/loss" in m}
    assert sorted(logged) == [5, 10]
    for metrics in logged.values():
        for key in ("throughput/tokens_per_sec", "throughput/samples_per_sec", "throughput/flops_per_sec",
                    "time/data_wait_fraction", "time/step_sec", "time/data_wait_sec", "time/forward_backward_sec",
                    "time/optimizer_sec", "time/other_sec", "memory/rss_peak_gb"):
            assert key in metrics, key
        assert "throughput/mfu" not in metrics  # a CPU has no peak in the table
        parts = sum(metrics[f"time/{k}_sec"] for k in ("data_wait", "forward_backward", "optimizer", "other"))
        assert parts >= metrics["time/step_sec"] * 0.999
    assert len(steps.step_times) == 12 and all(t > 0 for t in steps.step_times)

    summary = trainer.summary
    assert summary["summary/throughput/tokens_per_sec"] > 0 and summary["summary/time/train_sec"] > 0
    assert summary["summary/throughput/samples_per_sec"] == pytest.approx(
        12 * 4 / summary["summary/time/train_sec"], rel=1e-6)
    assert ("summary/time/train_sec" in recording.lines[-1][1]), "the summary is logged at the end"
    console = io.StringIO()
    progress = ProgressLogger(stream=console)
    progress.log_metrics(recording.lines[-1][1], 12)
    line = console.getvalue()
    assert line.startswith("[summary] ") and "tok/s" in line and "data/fwd+bwd/opt/other" in line, line


class FakeEvent:
    """A CUDA event stand-in: records the host time, counts synchronisations."""

    syncs = 0

    def __init__(self) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        FakeEvent.syncs += 1

    def elapsed_time(self, other: FakeEvent) -> float:
        return (other.t - self.t) * 1e3


def test_device_phases_are_read_only_at_log_points(monkeypatch):
    """On a GPU the phases are CUDA events, synchronised once when metrics are read, never per step."""
    meter = Throughput(window=4)
    meter._cuda = True
    monkeypatch.setattr(Throughput, "_event", staticmethod(FakeEvent))
    FakeEvent.syncs = 0
    meter.start()
    for i in range(1, 6):
        meter.begin_step(time.perf_counter())
        meter.start_phases()
        meter.mark("forward_backward")
        meter.mark("optimizer")
        meter.update(samples=8 * i, tokens=64 * i, data_wait=0.0)
    assert FakeEvent.syncs == 0
    metrics = meter.metrics(world_size=1, model_flops_per_token=1e6, device_peak_flops=1e9)
    assert FakeEvent.syncs == 1
    assert metrics["throughput/mfu"] == pytest.approx(metrics["throughput/tokens_per_sec"] * 1e6 / 1e9)
    assert metrics["time/forward_backward_sec"] >= 0 and metrics["time/step_sec"] > 0
    summary = meter.summary(world_size=1, samples=40, tokens=320)
    assert summary["summary/throughput/tokens_per_sec"] > 0
