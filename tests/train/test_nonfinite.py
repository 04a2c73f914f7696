"""on_nonfinite="skip": a step whose loss or gradient norm is NaN or infinite changes neither the weights nor
the optimizer's state, is counted (`train/skipped_steps`), and more than max_skipped_steps stop the run.
The reference run skips the same steps by construction (its optimizer does not step on those batches)."""

from __future__ import annotations

import gc
import os
import socket
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from tessera.train import Callback, Trainer
from tessera.train.nonfinite import NonFiniteError
from tessera.train.schedule import LinearWithWarmup
from tessera.train.trainer import seed_all

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
STEPS = 8


def batches() -> list[tuple[torch.Tensor, ...]]:
    """(x, y, batch number): the number tells the loss which batches to poison."""
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 3, generator=gen), torch.randn(4, 1, generator=gen), torch.full((4,), step))
            for step in range(1, STEPS + 1)]


def loss_fn(poison: set[int], kind: str):
    def loss(model: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        x, y, step = batch
        value = torch.nn.functional.mse_loss(model(x), y)
        if int(step[0]) in poison:
            if kind == "loss":
                return value * float("nan")
            if kind == "loss_only":  # a NaN loss whose gradient is finite
                return value + value.detach() * float("nan")
            # a finite loss whose gradient is NaN: d sqrt(0 * w)/dw = inf * 0
            return value + 1e-30 * torch.sqrt(0 * next(model.parameters()).sum())
        return value
    return loss


def skip_steps(opt: torch.optim.Optimizer, skip: set[int]) -> None:
    """Reference: the optimizer does not step on these batches (the scheduler still does)."""
    step, calls = opt.step, [0]

    def guarded(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return None if calls[0] in skip else step(*args, **kwargs)
    opt.step = types.MethodType(guarded, opt)  # type: ignore[method-assign]  # a method: LambdaLR wraps it


class Metrics(Callback):
    def __init__(self) -> None:
        self.logged: list[dict[str, float]] = []

    def on_batch_end(self, trainer: Any, metrics: dict[str, float]) -> None:
        self.logged.append(metrics)


def make_opt(name: str, model: torch.nn.Module) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=0.01)
    return torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1, fused=name == "adamw_fused")


def run(opt_name: str, poison: set[int], kind: str = "loss", reference_skip: set[int] = frozenset(),
        **settings: Any) -> tuple[Trainer, Metrics]:
    seed_all(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = make_opt(opt_name, model)
    metrics = Metrics()
    callbacks = [metrics]
    if reference_skip:
        skip_steps(opt, set(reference_skip))
    trainer = Trainer(model, opt, train_dataloader=batches(), loss_fn=loss_fn(poison, kind),
                      schedulers=LinearWithWarmup(warmup="2ba", alpha_f=0.2), callbacks=callbacks,
                      max_duration=f"{STEPS}ba", loggers=[], device="cpu", parallelism=None, **settings)
    trainer.fit()
    trainer.close()
    return trainer, metrics


def assert_same_state(a: Trainer, b: Trainer) -> None:
    for (name, x), y in zip(a.model.state_dict().items(), b.model.state_dict().values(), strict=True):
        assert torch.equal(x, y), name
    sa, sb = a.optimizers[0].state_dict()["state"], b.optimizers[0].state_dict()["state"]
    assert sa.keys() == sb.keys()
    for key in sa:
        for name, value in sa[key].items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(sb[key][name])), (key, name)
    assert a.optimizers[0].param_groups[0]["lr"] == b.optimizers[0].param_groups[0]["lr"]


@pytest.mark.parametrize("opt_name", ["adamw", "adamw_fused", "sgd"])
@pytest.mark.parametrize(("kind", "clip"), [("loss", None), ("grad", None), ("grad", 1.0)])
def test_skipped_steps_leave_weights_and_optimizer_state_as_if_never_taken(opt_name: str, kind: str,
                                                                           clip: float | None) -> None:
    poison = {1, 4, 5}  # the first step too: state the optimizer creates then must not survive
    skipped, metrics = run(opt_name, poison, kind, on_nonfinite="skip", grad_clip_norm=clip)
    reference, _ = run(opt_name, set(), kind, reference_skip=poison, grad_clip_norm=clip)
    assert_same_state(skipped, reference)
    assert all(torch.isfinite(p).all() for p in skipped.model.parameters())
    counts = [m["train/skipped_steps"] for m in metrics.logged]
    assert counts == [1, 1, 1, 2, 3, 3, 3, 3]
    assert skipped.timestamp.batch == STEPS  # the poisoned batches were consumed


def test_more_skipped_steps_than_allowed_stop_the_run() -> None:
    run("adamw", {2, 3}, on_nonfinite="skip", max_skipped_steps=2)  # exactly the bound: goes on
    with pytest.raises(NonFiniteError, match=r"3 steps were skipped by batch 6 .* more than max_skipped_steps=2"):
        run("adamw", {2, 3, 6}, on_nonfinite="skip", max_skipped_steps=2)
    # checked at the end of the run too, when no log line comes after the last skip
    with pytest.raises(NonFiniteError, match="more than max_skipped_steps=0"):
        run("adamw", {STEPS}, on_nonfinite="skip", max_skipped_steps=0, log_interval=f"{STEPS * 2}ba")


def test_the_default_still_stops_at_the_first_nonfinite_step() -> None:
    with pytest.raises(NonFiniteError, match="NaN or infinite at batch 3"):
        run("adamw", {3})


def _ddp_rank(rank: int, port: int, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    seed_all(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    metrics = Metrics()
    trainer = Trainer(model, torch.optim.AdamW(model.parameters(), lr=0.05), train_dataloader=batches()[:6],
                      loss_fn=loss_fn({3} if rank == 0 else set(), "loss_only"), callbacks=[metrics], max_duration="6ba",
                      loggers=[], device="cpu", parallelism="ddp", on_nonfinite="skip")
    trainer.fit()
    torch.save({"weights": trainer.model.state_dict(), "skipped": [m["train/skipped_steps"] for m in metrics.logged]},
               f"{out}/rank{rank}.pt")
    trainer.close()
    # Gloo's threads must be joined before the process exits, or C++ aborts it ("terminate called without
    # an active exception"). The DDP wrapper goes first: freed after destroy_process_group, its reducer would
    # hold the last reference to the group and join gloo's thread while holding the GIL that thread waits for.
    del trainer
    gc.collect()
    torch.distributed.destroy_process_group()


def test_under_ddp_every_rank_skips_when_one_ranks_loss_is_nan(tmp_path: Path) -> None:
    """Only rank 0's loss is NaN and the averaged gradients are finite: rank 1 must skip too."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    torch.multiprocessing.spawn(_ddp_rank, args=(port, str(tmp_path)), nprocs=2)
    a, b = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    assert a["skipped"] == b["skipped"] == [0, 0, 1, 1, 1, 1]
    for name, value in a["weights"].items():
        assert torch.equal(value, b["weights"][name]) and torch.isfinite(value).all(), name


def test_skip_under_float16_joins_the_scalers_overflow_check() -> None:
    trainer, metrics = run("adamw", {2, 5}, on_nonfinite="skip", precision="amp_fp16")
    assert metrics.logged[-1]["train/skipped_steps"] == 2
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
